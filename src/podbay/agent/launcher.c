/* The launcher of commands under the guard (gVisor), as a small static program.
 *
 * podbay/agent/launcher.py forks the launcher from the agent and execs this
 * program (when podbay built it: podbay.runtime.native_build, at install,
 * statically), which makes the commands' user namespace.
 * It speaks the same protocol as the Python loop it replaces (launcher.py's
 * _serve): requests on fd argv[1] (a length, then the body encode_request
 * makes, with the command's three streams as SCM_RIGHTS), a fixed-size
 * answer on the same socket, and (pid, exit code) records on fd argv[2].
 *
 * Why C: CPython's vfork child queries and resets every signal's handler
 * (~65 rt_sigaction calls) and reports through a pipe; under gVisor's ptrace
 * platform each system call is a trap, and those were half of the system
 * calls of an exec of `true`. Here the child makes only the calls the
 * command needs: its streams, cwd, session, ids, terminal, mask and execve.
 *
 * Signals: every disposition starts at its default (an ignored one would
 * pass to every command); the ones a `pkill` in the sandbox would send are
 * caught by a handler that does nothing (exec resets it to the default, and
 * it is harmless if it runs in a vfork child). All signals stay blocked but
 * while waiting in ppoll; a child unblocks them just before execve.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <sched.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <termios.h>
#include <unistd.h>

/* What failed in an answer, the limits of a request, its flags: shared with
 * launcher.py, generated from podbay/agent/protocol.py. */
#include "launcher_protocol.h"

static int requests = -1, exits = -1, devnull = -1;

/* Written by a vfork child (it shares our memory) before it gives up. */
static volatile int child_failed, child_errno;

static volatile sig_atomic_t exited;

static void shrug(int signum) { (void)signum; }

static void child_exited(int signum)
{
    (void)signum;
    exited = 1;
}

static void die(void) { _exit(1); }

static void send_all(int fd, const void *data, size_t size)
{
    const char *p = data;
    while (size > 0) {
        ssize_t n = send(fd, p, size, MSG_NOSIGNAL);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            die();
        }
        p += n;
        size -= (size_t)n;
    }
}

static void read_all(int fd, void *data, size_t size)
{
    char *p = data;
    while (size > 0) {
        ssize_t n = recv(fd, p, size, 0);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            die();
        p += n;
        size -= (size_t)n;
    }
}

static uint32_t be32(const unsigned char *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

static void put32(unsigned char *p, uint32_t v)
{
    p[0] = v >> 24;
    p[1] = v >> 16;
    p[2] = v >> 8;
    p[3] = v;
}

/* launcher.py's _ANSWER: pid, errno, what failed (!iii), reason length (!H). */
static void answer(int pid, int code, int failed, const char *reason)
{
    unsigned char out[14 + 256];
    size_t length = reason ? strlen(reason) : 0;
    if (length > 256)
        length = 256;
    put32(out, (uint32_t)pid);
    put32(out + 4, (uint32_t)code);
    put32(out + 8, (uint32_t)failed);
    out[12] = length >> 8;
    out[13] = length & 0xff;
    if (length)
        memcpy(out + 14, reason, length);
    send_all(requests, out, 14 + length);
}

/* launcher.py's _EXIT: pid, exit code (128+N for signal N). */
static void reap(void)
{
    int status;
    pid_t pid;
    while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
        unsigned char out[8];
        int code = WIFSIGNALED(status) ? 128 + WTERMSIG(status) : WEXITSTATUS(status);
        put32(out, (uint32_t)pid);
        put32(out + 4, (uint32_t)code);
        send_all(exits, out, sizeof out);
    }
}

struct request {
    uint32_t flags, ngroups, nexec, argc, envc;
    int32_t uid, gid;
    gid_t *groups;
    char *cwd, **exec, **argv, **envp;
};

/* The body (launcher.py's encode_request): !IiiIIII flags, uid, gid, ngroups,
 * nexec, argc, envc; ngroups x !I; then cwd, the nexec paths to try, argv and
 * envp, each ended by a NUL. Anything else ends the launcher. */
static void parse(char *body, size_t size, struct request *r)
{
    const unsigned char *u = (const unsigned char *)body;
    if (size < 28)
        die();
    r->flags = be32(u);
    r->uid = (int32_t)be32(u + 4);
    r->gid = (int32_t)be32(u + 8);
    r->ngroups = be32(u + 12);
    r->nexec = be32(u + 16);
    r->argc = be32(u + 20);
    r->envc = be32(u + 24);
    if (r->ngroups > MAX_GROUPS || r->nexec == 0 || r->argc == 0 ||
        (uint64_t)r->nexec + r->argc + r->envc > MAX_STRINGS ||
        size - 28 < (size_t)r->ngroups * 4)
        die();
    size_t at = 28;
    r->groups = calloc(r->ngroups + 1, sizeof(gid_t));
    char **strings = calloc((size_t)r->nexec + r->argc + r->envc + 5, sizeof(char *));
    if (!r->groups || !strings)
        die();
    for (uint32_t i = 0; i < r->ngroups; i++, at += 4)
        r->groups[i] = be32(u + at);
    size_t count = 1 + (size_t)r->nexec + r->argc + r->envc;
    for (size_t i = 0; i < count; i++) {
        char *end = memchr(body + at, '\0', size - at);
        if (!end)
            die();
        strings[i] = body + at;
        at = (size_t)(end - body) + 1;
    }
    if (at != size)
        die();
    r->cwd = strings[0];
    r->exec = strings + 1;
    /* Each list ends with a NULL: the strings are moved one slot per list. */
    memmove(strings + 1 + r->nexec + 1, strings + 1 + r->nexec,
            ((size_t)r->argc + r->envc) * sizeof(char *));
    r->exec[r->nexec] = NULL;
    r->argv = strings + 1 + r->nexec + 1;
    memmove(r->argv + r->argc + 1, r->argv + r->argc, (size_t)r->envc * sizeof(char *));
    r->argv[r->argc] = NULL;
    r->envp = r->argv + r->argc + 1;
    r->envp[r->envc] = NULL;
}

/* In the vfork child: only system calls, then execve or _exit. */
static void child(const struct request *r, const int streams[3])
{
    sigset_t none;
    for (int n = 0; n < 3; n++)
        if (dup2(streams[n], n) < 0) /* the streams are >= 3: dup2 clears CLOEXEC */
            goto failed;
    if (chdir(r->cwd) < 0) {
        child_errno = errno;
        child_failed = NO_CWD;
        _exit(127);
    }
    if (setsid() < 0)
        goto failed;
    /* Raw system calls: they change this process only (glibc's wrappers would
     * broadcast to threads the parent does not have). */
    if (r->uid >= 0 || r->gid >= 0) {
        if (syscall(SYS_setgroups, (size_t)r->ngroups, r->groups) < 0)
            goto failed;
        if (r->gid >= 0 && syscall(SYS_setresgid, r->gid, r->gid, r->gid) < 0)
            goto failed;
        if (r->uid >= 0 && syscall(SYS_setresuid, r->uid, r->uid, r->uid) < 0)
            goto failed;
    }
    if ((r->flags & FLAG_TERMINAL) && ioctl(0, TIOCSCTTY, 0) < 0) {
        child_errno = errno;
        child_failed = REFUSED;
        _exit(127);
    }
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    /* The PATH search subprocess does: the first error that is not "not there". */
    int first = 0;
    for (uint32_t i = 0; i < r->nexec; i++) {
        execve(r->exec[i], r->argv, r->envp);
        if (errno != ENOENT && errno != ENOTDIR && first == 0)
            first = errno;
    }
    errno = first ? first : errno;
failed:
    child_errno = errno;
    child_failed = NO_PROGRAM;
    _exit(127);
}

static void serve_one(void)
{
    unsigned char head[4];
    union {
        char buf[CMSG_SPACE(3 * sizeof(int))];
        struct cmsghdr align;
    } control;
    struct iovec iov = {head, sizeof head};
    struct msghdr msg = {0};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.buf;
    msg.msg_controllen = sizeof control.buf;
    ssize_t got;
    do
        got = recvmsg(requests, &msg, MSG_CMSG_CLOEXEC);
    while (got < 0 && errno == EINTR);
    if (got <= 0)
        _exit(got == 0 ? 0 : 1); /* the agent went away */
    int fds[3], nfds = 0;
    for (struct cmsghdr *c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
        if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
            continue;
        size_t n = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (size_t i = 0; i < n; i++) {
            int fd;
            memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof fd);
            if (nfds < 3)
                fds[nfds++] = fd;
            else
                close(fd);
        }
    }
    if (msg.msg_flags & MSG_CTRUNC)
        die();
    if ((size_t)got < sizeof head)
        read_all(requests, head + got, sizeof head - (size_t)got);
    uint32_t size = be32(head);
    if (size > MAX_BODY)
        die();
    char *body = malloc(size + 1);
    if (!body)
        die();
    read_all(requests, body, size);
    struct request r;
    parse(body, size, &r);
    int streams[3], given = 0;
    for (int n = 0; n < 3; n++)
        streams[n] = (r.flags >> (FLAG_STREAM_SHIFT + n) & 1) && given < nfds ? fds[given++] : devnull;
    if (given != nfds) {
        answer(0, 0, INVALID, "the request came with other streams than it named");
    } else {
        child_failed = 0;
        child_errno = 0;
        pid_t pid = vfork();
        if (pid == 0)
            child(&r, streams);
        if (pid < 0) {
            answer(0, errno, NO_PROGRAM, strerror(errno));
        } else if (child_failed) {
            int status;
            while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
                ;
            const char *why = child_failed == REFUSED ? "cannot take the terminal"
                                                      : strerror(child_errno);
            answer(0, child_errno, child_failed, why);
        } else {
            answer(pid, 0, STARTED, NULL);
        }
    }
    for (int i = 0; i < nfds; i++)
        close(fds[i]);
    free(body);
    free(r.groups);
    free(r.exec - 1);
}

/* guard.enter_own_namespace: a new user namespace, with the capabilities
 * `foreign` (the agent lacks them) out of the bounding set; our pid to the
 * agent on `unshared`, which answers "1" on `mapped` once it wrote our id
 * maps; then root there with groups [0]. */
static int enter_own_namespace(int unshared, int mapped, unsigned long long foreign)
{
    char pid[24], ok = 0;
    if (unshare(CLONE_NEWUSER) < 0)
        return -1;
    for (int cap = 0; cap < 64; cap++) /* one past the kernel's last is EINVAL: fine */
        if (foreign >> cap & 1)
            prctl(PR_CAPBSET_DROP, cap, 0, 0, 0);
    int length = snprintf(pid, sizeof pid, "%d", (int)getpid());
    if (write(unshared, pid, (size_t)length) != length || read(mapped, &ok, 1) != 1 || ok != '1')
        return -1;
    gid_t root = 0;
    if (setgroups(1, &root) < 0 || setresgid(0, 0, 0) < 0 || setresuid(0, 0, 0) < 0)
        return -1;
    close(unshared);
    close(mapped);
    return 0;
}

/* argv: the request and exit sockets, the two pipes of
 * enter_own_namespace, the capabilities to drop (hex mask). Started by the
 * agent's fork with /dev/null as 0, 1 and 2 and nothing else open. */
int main(int argc, char **argv)
{
    if (argc != 6)
        return 2;
    /* Not dumpable, and our memory is the sandbox's user namespace's (made by
     * this exec, before the commands' namespace): the commands' root, which
     * has no capability there, cannot trace us. */
    if (prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) < 0)
        return 1;
    requests = atoi(argv[1]);
    exits = atoi(argv[2]);
    devnull = open("/dev/null", O_RDWR | O_CLOEXEC);
    if (devnull < 3 || fcntl(requests, F_SETFD, FD_CLOEXEC) < 0 ||
        fcntl(exits, F_SETFD, FD_CLOEXEC) < 0)
        return 1;
    if (enter_own_namespace(atoi(argv[3]), atoi(argv[4]), strtoull(argv[5], NULL, 16)) < 0)
        return 1;
    sigset_t all, none;
    sigfillset(&all);
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &all, NULL);
    struct sigaction dfl = {0}, caught = {0};
    dfl.sa_handler = SIG_DFL;
    caught.sa_handler = shrug;
    sigfillset(&caught.sa_mask);
    for (int s = 1; s < NSIG; s++) /* glibc refuses its own two: they are at default */
        if (s != SIGKILL && s != SIGSTOP)
            sigaction(s, &dfl, NULL);
    int shrugged[] = {SIGHUP, SIGINT, SIGQUIT, SIGTERM, SIGUSR1, SIGUSR2, SIGALRM};
    for (size_t i = 0; i < sizeof shrugged / sizeof shrugged[0]; i++)
        sigaction(shrugged[i], &caught, NULL);
    caught.sa_handler = child_exited;
    sigaction(SIGCHLD, &caught, NULL);
    for (;;) {
        struct pollfd p = {requests, POLLIN, 0};
        int ready = ppoll(&p, 1, NULL, &none); /* a SIGCHLD interrupts it */
        if (exited) {
            exited = 0;
            reap();
        }
        if (ready > 0)
            serve_one();
    }
}
