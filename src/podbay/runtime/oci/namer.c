/* Names a gvisor sandbox: sets its hostname to the one line read from stdin.
 *
 * Started with CAP_SYS_ADMIN by `runsc exec` while a warm pool's machine
 * waits (runtime/oci/namer.py), it blocks on a pipe the host holds; the
 * hand-out writes the name and waits for this process to exit. Static and
 * podbay's own, so no program of the image runs with that capability and
 * nothing is loaded at the hand-out. EOF before a whole line (the machine
 * stopped, destroyed, or the server gone) exits without naming.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <string.h>
#include <unistd.h>

#define NAME_MAX_BYTES 64 /* the kernel's HOST_NAME_MAX */

int main(void)
{
    char line[NAME_MAX_BYTES + 1];
    size_t len = 0;
    char *end = NULL;
    while (end == NULL && len < sizeof line) {
        ssize_t n = read(STDIN_FILENO, line + len, sizeof line - len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return 2;
        end = memchr(line + len, '\n', (size_t)n);
        len += (size_t)n;
    }
    if (end == NULL || end == line)
        return 2; /* too long, or empty: not a name */
    return sethostname(line, (size_t)(end - line)) == 0 ? 0 : 1;
}
