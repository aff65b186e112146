/* Preloaded into every process of a gvisor sandbox (/etc/ld.so.preload).
 *
 * gVisor as Debian ships it (2022-12) refuses AT_NO_AUTOMOUNT in statx and
 * fstatat with EINVAL. Linux accepts the flag (it only matters for autofs,
 * which a sandbox has none of), and coreutils passes it on every call, so
 * ls, stat, du, find and cp -a failed on every path. These wrappers make the
 * same system calls without that flag. Built by podbay with the host's C
 * compiler when the gvisor class is prepared (runtime/oci/runsc.py).
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

int statx(int dirfd, const char *path, int flags, unsigned int mask, struct statx *buf)
{
    return (int)syscall(SYS_statx, dirfd, path, flags & ~AT_NO_AUTOMOUNT, mask, buf);
}

int fstatat(int dirfd, const char *path, struct stat *buf, int flags)
{
    return (int)syscall(SYS_newfstatat, dirfd, path, buf, flags & ~AT_NO_AUTOMOUNT);
}

int fstatat64(int dirfd, const char *path, struct stat64 *buf, int flags)
{
    return (int)syscall(SYS_newfstatat, dirfd, path, buf, flags & ~AT_NO_AUTOMOUNT);
}
