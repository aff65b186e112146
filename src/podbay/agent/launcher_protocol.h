/* Generated from podbay/agent/protocol.py by podbay.runtime.native_build:
 * edit that module, not this file. */
#ifndef PODBAY_LAUNCHER_PROTOCOL_H
#define PODBAY_LAUNCHER_PROTOCOL_H
enum { STARTED = 0, NO_PROGRAM = 1, NO_CWD = 2, REFUSED = 3, INVALID = 4 };
#define MAX_BODY 8388608u
#define MAX_GROUPS 65536u
#define MAX_STRINGS 262144u
#define FLAG_TERMINAL 1u
#define FLAG_STREAM_SHIFT 1u
#endif
