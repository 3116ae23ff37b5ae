/* service/targets.c: finding and signalling the processes an attach session or the
 * daemon profiles. */
#include "service/svc.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/macros.h"
#include "common/paths.h"

static int read_small(const char *path, char *buf, size_t len, size_t *ret_n)
{
    HP_CLEANUP_CLOSE int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    size_t n = 0;
    while (n < len) {
        ssize_t k = read(fd, buf + n, len - n);
        if (k < 0 && errno == EINTR)
            continue;
        if (k < 0)
            return -errno;
        if (k == 0)
            break;
        n += (size_t)k;
    }
    *ret_n = n;
    return 0;
}

int svc_proc_inspect(pid_t pid, struct svc_proc *ret)
{
    char path[64], buf[4096];
    size_t n = 0;
    struct stat st;

    memset(ret, 0, sizeof(*ret));
    ret->pid = pid;
    snprintf(path, sizeof(path), "/proc/%d", (int)pid);
    if (stat(path, &st) < 0)
        return -errno;
    ret->same_user = st.st_uid == geteuid();

    snprintf(path, sizeof(path), "/proc/%d/cmdline", (int)pid);
    if (read_small(path, buf, sizeof(buf) - 1, &n) == 0 && n > 0) {
        buf[n] = '\0';
        const char *base = strrchr(buf, '/');
        snprintf(ret->name, sizeof(ret->name), "%.63s", base ? base + 1 : buf);
    } else {
        snprintf(path, sizeof(path), "/proc/%d/comm", (int)pid);
        if (read_small(path, buf, sizeof(buf) - 1, &n) == 0) {
            buf[n] = '\0';
            buf[strcspn(buf, "\n")] = '\0';
            snprintf(ret->name, sizeof(ret->name), "%.63s", buf);
        }
    }

    /* libheapprof.so mapped? Read /proc/PID/maps in chunks, keeping a line's tail. */
    snprintf(path, sizeof(path), "/proc/%d/maps", (int)pid);
    HP_CLEANUP_CLOSE int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return errno == ENOENT ? -ENOENT : 0; /* no permission: not preloaded as far as
                                                 we can tell */
    size_t keep = 0;
    for (;;) {
        ssize_t k = read(fd, buf + keep, sizeof(buf) - 1 - keep);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            break;
        size_t total = keep + (size_t)k;
        buf[total] = '\0';
        if (strstr(buf, "/libheapprof.so")) {
            ret->preloaded = true;
            break;
        }
        keep = total < 32 ? total : 32;
        memmove(buf, buf + total - keep, keep);
    }
    return 0;
}

int svc_attach_signal(void)
{
    const char *e = getenv("HEAPPROF_ATTACH_SIGNAL");
    if (e && *e) {
        char *end;
        long v = strtol(e, &end, 10);
        if (*end == '\0' && v > 0 && v < NSIG)
            return (int)v;
    }
    return SIGRTMIN + 4;
}

int svc_proc_signal_attach(pid_t pid, pid_t attacher)
{
    union sigval v = {.sival_int = (int)attacher};
    if (sigqueue(pid, svc_attach_signal(), v) < 0)
        return -errno;
    return 0;
}

void svc_proc_scan_targets(const struct svc_config *cfg,
                           void (*fn)(void *ctx, const struct svc_proc *p), void *ctx)
{
    DIR *d = opendir("/proc");
    if (!d)
        return;
    struct dirent *e;
    pid_t self = getpid();
    while ((e = readdir(d)) != NULL) {
        char *end;
        long pid = strtol(e->d_name, &end, 10);
        if (*end || pid <= 0 || pid == self)
            continue;
        char path[64], cmd[4096];
        size_t n = 0;
        snprintf(path, sizeof(path), "/proc/%ld/cmdline", pid);
        if (read_small(path, cmd, sizeof(cmd), &n) < 0 || n == 0 ||
            !svc_config_matches(cfg, (int32_t)pid, cmd, n))
            continue;
        struct svc_proc p;
        if (svc_proc_inspect((pid_t)pid, &p) < 0 || !p.preloaded)
            continue;
        fn(ctx, &p);
    }
    closedir(d);
}
