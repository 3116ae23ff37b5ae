/* common/rundir.c: the directories the service's sockets live in (common/paths.h), the
 * one place that decides where they are and checks who owns them. */
#include "common/paths.h"

#include <errno.h>
#include <fcntl.h>
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

int hp_shared_dir_prepare(char *buf, size_t len, char *err, size_t err_len)
{
    const char *dir = HP_SHARED_SOCKET_DIR;
    if (strlen(dir) + 1 > len) {
        snprintf(err, err_len, "path too long");
        return -ENAMETOOLONG;
    }
    if (mkdir(dir, 0755) < 0 && errno != EEXIST) {
        int r = -errno;
        snprintf(err, err_len, "cannot create %s: %s", dir, strerror(-r));
        return r;
    }
    /* Checked and changed through one descriptor: a directory swapped for a symlink in
     * between is never chmod'ed. */
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) < 0) {
        int r = -errno;
        if (fd >= 0)
            (void)close(fd);
        snprintf(err, err_len, "%s: %s (a symlink?)", dir, strerror(-r));
        return r;
    }
    int r = 0;
    if (st.st_uid != geteuid() || (st.st_mode & 022) != 0) {
        snprintf(err, err_len,
                 "%s must be a directory owned by uid %u and writable by nobody else (mode "
                 "%04o, owner %u)",
                 dir, (unsigned)geteuid(), (unsigned)(st.st_mode & 07777), (unsigned)st.st_uid);
        r = -EPERM;
    } else if ((st.st_mode & 0755) != 0755 && fchmod(fd, 0755) < 0) {
        r = -errno;
        snprintf(err, err_len, "cannot make %s searchable by other users: %s", dir, strerror(-r));
    }
    (void)close(fd);
    if (r == 0)
        memcpy(buf, dir, strlen(dir) + 1);
    return r;
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
