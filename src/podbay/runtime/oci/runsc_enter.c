/* Starts `runsc run` where runsc.py's launch_argv wants it, in one exec:
 *
 *     runsc-enter NETNS PROC_DIR RUNSC ARGS...
 *
 * enters the machine's network namespace NETNS (nsenter --net), a mount
 * namespace of its own whose mounts are slaves of the host's (unshare --mount
 * --propagation slave), mounts a procfs on PROC_DIR and covers
 * /proc/sys/net/core with an empty read-only tmpfs (runsc's test for "the
 * host's root network namespace"; see runsc.py), then execs RUNSC. The same
 * as the nsenter, unshare, sh and two mount processes it replaces (~10 ms of
 * a sandbox's start on a loaded host). Built by podbay with the host's C
 * compiler beside the statx shim; without it runsc.py starts that chain.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <errno.h>
#include <sys/mount.h>
#include <unistd.h>

static int fail(const char *what, const char *arg)
{
    fprintf(stderr, "runsc-enter: %s %s: %s\n", what, arg, strerror(errno));
    return 125;
}

int main(int argc, char **argv)
{
    if (argc < 4) {
        fprintf(stderr, "usage: runsc-enter NETNS PROC_DIR RUNSC [ARGS...]\n");
        return 125;
    }
    int netns = open(argv[1], O_RDONLY | O_CLOEXEC);
    if (netns < 0 || setns(netns, CLONE_NEWNET) < 0)
        return fail("cannot enter the network namespace", argv[1]);
    close(netns);
    if (unshare(CLONE_NEWNS) < 0)
        return fail("cannot make a mount namespace", "");
    if (mount("none", "/", NULL, MS_REC | MS_SLAVE, NULL) < 0)
        return fail("cannot make the mounts slaves", "/");
    if (mount("podbay", argv[2], "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL) < 0)
        return fail("cannot mount a procfs on", argv[2]);
    if (mount("podbay", "/proc/sys/net/core", "tmpfs", MS_RDONLY, "size=4k,mode=555") < 0)
        return fail("cannot cover", "/proc/sys/net/core");
    execvp(argv[3], argv + 3);
    return fail("cannot run", argv[3]);
}
