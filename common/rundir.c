/* common/rundir.c: the directories the service's sockets live in (common/paths.h), the
 * one place that decides where they are and checks who owns them. */
#include "common/paths.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int hp_runtime_dir_prepare(char *buf, size_t len, char *err, size_t err_len)
{
    int r = hp_runtime_dir(getenv("XDG_RUNTIME_DIR"), getuid(), buf, len);
    if (r < 0) {
        snprintf(err, err_len, "runtime directory path too long");
        return r;
    }
    if (mkdir(buf, 0700) < 0 && errno != EEXIST) {
        r = -errno;
        snprintf(err, err_len, "cannot create %s: %s", buf, strerror(-r));
        return r;
    }
    struct stat st;
    if (lstat(buf, &st) < 0) {
        r = -errno;
        snprintf(err, err_len, "%s: %s", buf, strerror(-r));
        return r;
    }
    if (!S_ISDIR(st.st_mode) || st.st_uid != getuid() || (st.st_mode & 077) != 0) {
        snprintf(err, err_len,
                 "%s must be a directory owned by uid %u with mode 0700 (someone else's "
                 "or a symlink?)",
                 buf, (unsigned)getuid());
        return -EPERM;
    }
    return 0;
}

int hp_private_dir_new(char *buf, size_t len)
{
    const char *base = getenv("XDG_RUNTIME_DIR");
    struct stat st;
    if (!base || base[0] != '/' || stat(base, &st) < 0 || !S_ISDIR(st.st_mode) ||
        access(base, W_OK | X_OK) < 0)
        base = "/tmp";
    int n = snprintf(buf, len, "%s/heapprof-XXXXXX", base);
    if (n < 0 || (size_t)n >= len)
        return -ENAMETOOLONG;
    if (!mkdtemp(buf)) /* mode 0700 */
        return -errno;
    return 0;
}
