"""What the agent shares with those outside it: the host's runtime, and the
launcher of commands written in C (``launcher.c``).

This is the one module of :mod:`podbay.agent` that the runtime may import;
it imports nothing. The launcher's constants are written here once: the C
program reads them from ``launcher_protocol.h``, generated from this module
by :func:`c_header` when the C programs are built
(:mod:`podbay.runtime.native_build`); a test checks that the committed
header is what this module generates.
"""

from __future__ import annotations

#: The agent's uid under gVisor: the last id of the sandbox's range (65536
#: ids from 0), so the files it creates map to the host before it claims them.
DEFAULT_UID = 65535

#: The environment variable with the idle seconds before the agent hibernates.
HIBERNATE_ENV = "PODBAY_AGENT_HIBERNATE_SECONDS"

# What failed, in a launcher's answer to a request to start a command.
STARTED = 0
NO_PROGRAM = 1
NO_CWD = 2
REFUSED = 3
INVALID = 4

#: The largest request the launcher reads: argv and env past it fail execve
#: anyway (E2BIG: Linux takes at most a quarter of the stack limit), so the
#: agent refuses so without sending.
MAX_REQUEST = 8 << 20
#: The most supplementary groups and strings (paths, argv, env) a request holds.
MAX_GROUPS = 65536
MAX_STRINGS = 262144
#: A request's flags: bit 0 makes stdin the controlling terminal; bits 1-3
#: say which of stdin, stdout and stderr came with the request.
FLAG_TERMINAL = 1
FLAG_STREAM_SHIFT = 1

#: The header's name beside ``launcher.c``.
C_HEADER = "launcher_protocol.h"


def c_header() -> str:
    """The C header ``launcher.c`` includes, with this module's constants."""
    codes = ", ".join(
        f"{name} = {value}"
        for name, value in (
            ("STARTED", STARTED),
            ("NO_PROGRAM", NO_PROGRAM),
            ("NO_CWD", NO_CWD),
            ("REFUSED", REFUSED),
            ("INVALID", INVALID),
        )
    )
    return (
        "/* Generated from podbay/agent/protocol.py by podbay.runtime.native_build:\n"
        " * edit that module, not this file. */\n"
        "#ifndef PODBAY_LAUNCHER_PROTOCOL_H\n"
        "#define PODBAY_LAUNCHER_PROTOCOL_H\n"
        f"enum {{ {codes} }};\n"
        f"#define MAX_BODY {MAX_REQUEST}u\n"
        f"#define MAX_GROUPS {MAX_GROUPS}u\n"
        f"#define MAX_STRINGS {MAX_STRINGS}u\n"
        f"#define FLAG_TERMINAL {FLAG_TERMINAL}u\n"
        f"#define FLAG_STREAM_SHIFT {FLAG_STREAM_SHIFT}u\n"
        "#endif\n"
    )
