/* cli/output.c: opening the trace file, safely in a directory other users can write to
 * (the current directory may be /tmp; heapprofd's default directory may be shared).
 *
 * The danger is a name someone else prepared: a symlink to a file of ours (or, when we
 * run as root, to any file), a hard link to one, or a file of theirs; open(O_CREAT |
 * O_TRUNC) would follow it and truncate what it names. So:
 *   - a new file is created with O_EXCL | O_NOFOLLOW: nothing that was there is touched;
 *   - a name we made up (heapprof-<prog>-<pid>.pftrace, heapprofd-<date>-<pid>.pftrace)
 *     never reuses a file: the next free "<stem>.N<ext>" is taken (a recycled pid used
 *     to overwrite an older trace);
 *   - a name the user gave that exists is overwritten when it is plainly the user's: a
 *     regular file owned by our effective uid with a single link; a symlink is followed
 *     only when it is ours or root's (/dev/stdout, /dev/fd/N of a shell's process
 *     substitution); a FIFO or character device (a pipe, a terminal, /dev/null) is
 *     written to as it is. Anything else is refused with a message.
 */
#include "cli/cli.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define OUTPUT_MAX_SUFFIX 99

/* "<what> '<path>': <strerror>" in @err; returns @r. */
static int fail(char *err, size_t err_len, int r, const char *what, const char *path)
{
    snprintf(err, err_len, "%s '%s': %s", what, path, strerror(-r));
    return r;
}

/* An existing @path the user named (@lst: its lstat). */
static int open_existing(const char *path, const struct stat *lst, char *err, size_t err_len)
{
    uid_t me = geteuid();
    bool link = S_ISLNK(lst->st_mode);
    if (link && lst->st_uid != me && lst->st_uid != 0) {
        snprintf(err, err_len,
                 "'%s' is a symbolic link owned by uid %u: not following it (remove it or "
                 "name another file)",
                 path, (unsigned)lst->st_uid);
        return -EPERM;
    }
    struct stat st;
    if (stat(path, &st) < 0)
        return fail(err, err_len, -errno, "cannot write the trace to", path);
    if (S_ISREG(st.st_mode)) {
        if (st.st_uid != me || st.st_nlink != 1) {
            snprintf(err, err_len,
                     st.st_uid != me ? "'%s' belongs to uid %u: not overwriting it (remove it or "
                                       "name another file)"
                                     : "'%s' has %u hard links: not overwriting it (remove it "
                                       "or name another file)",
                     path, st.st_uid != me ? (unsigned)st.st_uid : (unsigned)st.st_nlink);
            return -EPERM;
        }
    } else if (!S_ISFIFO(st.st_mode) && !S_ISCHR(st.st_mode)) {
        snprintf(err, err_len, "'%s' is not a regular file, a pipe or a terminal", path);
        return -EINVAL;
    }
    int fd = open(path, O_WRONLY | O_CLOEXEC | O_NOCTTY | (link ? 0 : O_NOFOLLOW));
    if (fd < 0)
        return fail(err, err_len, -errno, "cannot write the trace to", path);
    /* What was checked is what was opened: a swap in between is refused. */
    struct stat fst;
    if (fstat(fd, &fst) < 0 || fst.st_dev != st.st_dev || fst.st_ino != st.st_ino) {
        (void)close(fd);
        snprintf(err, err_len, "'%s' changed while it was opened: not writing to it", path);
        return -EAGAIN;
    }
    if (S_ISREG(fst.st_mode) && ftruncate(fd, 0) < 0) {
        int r = -errno;
        (void)close(fd);
        return fail(err, err_len, r, "cannot truncate", path);
    }
    return fd;
}

int cli_output_open(const char *path, bool made_up, char *ret_path, size_t path_len, char *err,
                    size_t err_len)
{
    const int flags = O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC | O_NOCTTY;
    size_t n = strlen(path);
    if (n + 1 > path_len) {
        return fail(err, err_len, -ENAMETOOLONG, "cannot write the trace to", path);
    }
    memcpy(ret_path, path, n + 1);
    int fd = open(path, flags, 0644);
    if (fd >= 0)
        return fd;
    if (errno != EEXIST)
        return fail(err, err_len, -errno, "cannot write the trace to", path);
    if (made_up) {
        /* "<stem>.N<ext>", the extension being the part from the last dot of the file
         * name on. */
        const char *base = strrchr(path, '/');
        const char *dot = strrchr(base ? base + 1 : path, '.');
        size_t stem = dot ? (size_t)(dot - path) : n;
        for (int k = 1; k <= OUTPUT_MAX_SUFFIX; k++) {
            int w = snprintf(ret_path, path_len, "%.*s.%d%s", (int)stem, path, k, dot ? dot : "");
            if (w < 0 || (size_t)w >= path_len)
                break;
            fd = open(ret_path, flags, 0644);
            if (fd >= 0)
                return fd;
            if (errno != EEXIST)
                return fail(err, err_len, -errno, "cannot write the trace to", ret_path);
        }
        memcpy(ret_path, path, n + 1);
        snprintf(err, err_len, "'%s' and its numbered variants exist: not overwriting them", path);
        return -EEXIST;
    }
    struct stat lst;
    if (lstat(path, &lst) < 0)
        return fail(err, err_len, -errno, "cannot write the trace to", path);
    return open_existing(path, &lst, err, err_len);
}
