/* service/targets.c: finding the processes an attach session or the daemon profiles.
 *
 * A process is attachable when its client advertises its wake entry (a memfd page named
 * "heapprof-attach-wake" in its maps, common/wake.h); service/wake.c wakes it with a
 * remote call, after checking through a pidfd that the pid still names the process
 * inspected (same start time), so that a pid reused meanwhile is never touched. */
#include "service/targets.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
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

    /* Who it is: the start time, which a reused pid does not share. */
    snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
    if (read_small(path, buf, sizeof(buf) - 1, &n) == 0) {
        buf[n] = '\0';
        const char *p = strrchr(buf, ')');
        /* after the name: state is field 3, starttime field 22 */
        for (int field = 2; p && field < 22; field++)
            p = strchr(p + 1, ' ');
        if (p)
            ret->start_time = strtoull(p + 1, NULL, 10);
    }

    /* libheapprof.so mapped, its wake entry advertised? */
    HP_CLEANUP_FREE char *maps = svc__proc_maps(pid);
    if (!maps)
        return errno == ENOENT ? -ENOENT : 0; /* no permission: not preloaded as far as
                                                 we can tell */
    ret->preloaded = strstr(maps, "/libheapprof.so") != NULL;
    ret->wake_page = svc__wake_page_addr(maps);
    ret->attach_ready = ret->wake_page != 0;
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
