/* The hibernating agent's stand-in under gVisor (podbay/agent/hibernate.py).
 *
 *     waiter FD PROGRAM ARG...
 *
 * Waits until the listening socket FD has a connection queued, then executes
 * PROGRAM with its arguments: the agent's own command line, which serves FD
 * and accepts that connection. The agent executes it when idle, in place of a
 * bare Python interpreter (the waiter in hibernate.py): under gVisor every
 * page an application touches is the sandbox's memory in the sentry and in
 * ptrace's stub process, and a static program touches a few dozen pages where
 * the interpreter touches megabytes. No signal handlers: as the sandbox's
 * PID 1 it then takes no signal from inside. Static: whatever the image's libc.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <unistd.h>

int main(int argc, char **argv)
{
    if (argc < 3)
        return 2;
    char *end = NULL;
    errno = 0;
    long fd = strtol(argv[1], &end, 10);
    if (errno != 0 || end == argv[1] || *end != '\0' || fd < 0 || fd > 65535)
        return 2;
    struct pollfd waiting = {.fd = (int)fd, .events = POLLIN};
    while (poll(&waiting, 1, -1) < 0 && errno == EINTR)
        ;
    for (;;) {
        execv(argv[2], argv + 2);
        /* Out of memory or processes for a moment: try again, as the Python
         * waiter does; the connection keeps waiting in the backlog. */
        poll(NULL, 0, 100);
    }
}
