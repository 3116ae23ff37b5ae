/* service/targets.c: finding and signalling the processes an attach session or the
 * daemon profiles.
 *
 * Our tools never kill: the default action of a real-time signal ends the process, so a
 * process is signalled only when its client advertises an installed handler (a memfd
 * named "heapprof-attach-<signo>" in its maps, created after sigaction() succeeded) and
 * the signal is caught (SigCgt), with the signal it advertises (not ours: it may have been
 * started with another HEAPPROF_ATTACH_SIGNAL), through a pidfd opened before the process
 * is checked again (same start time), so that a pid reused meanwhile is never hit. */
#include "service/targets.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "common/macros.h"
#include "common/paths.h"

#define ATTACH_MEMFD "/memfd:heapprof-attach-"

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

    /* libheapprof.so mapped, its handler advertised? Read /proc/PID/maps in chunks,
     * keeping a line's tail. */
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
        if (strstr(buf, "/libheapprof.so"))
            ret->preloaded = true;
        const char *ad = strstr(buf, ATTACH_MEMFD);
        if (ad && strchr(ad, ' ')) {
            char *end;
            long v = strtol(ad + strlen(ATTACH_MEMFD), &end, 10);
            if (*end == ' ' && v > 0 && v < NSIG)
                ret->attach_signo = (int)v;
        }
        if (ret->preloaded && ret->attach_signo)
            break;
        keep = total < 64 ? total : 64;
        memmove(buf, buf + total - keep, keep);
    }

    /* Caught now (the program may have reset it to SIG_DFL since)? */
    snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
    if (ret->attach_signo && read_small(path, buf, sizeof(buf) - 1, &n) == 0) {
        buf[n] = '\0';
        const char *c = strstr(buf, "\nSigCgt:");
        if (c) {
            unsigned long long mask = strtoull(c + 8, NULL, 16);
            ret->attach_ready = (mask >> (ret->attach_signo - 1)) & 1;
        }
    }
    return 0;
}

int svc_proc_signal_attach(const struct svc_proc *p, pid_t attacher)
{
    if (!p->attach_ready)
        return -EAGAIN;
    /* The pidfd pins the process we check next: if it dies and its pid is reused, the
     * check sees another start time, or the signal fails with ESRCH. */
    HP_CLEANUP_CLOSE int pidfd = (int)syscall(SYS_pidfd_open, p->pid, 0);
    if (pidfd < 0 && errno != ENOSYS)
        return -errno;
    struct svc_proc now;
    int r = svc_proc_inspect(p->pid, &now);
    if (r < 0)
        return r == -ENOENT ? -ESRCH : r;
    if (now.start_time != p->start_time)
        return -ESRCH;
    if (!now.attach_ready || now.attach_signo != p->attach_signo)
        return -EAGAIN;
    siginfo_t info;
    memset(&info, 0, sizeof(info));
    info.si_signo = p->attach_signo;
    info.si_code = SI_QUEUE;
    info.si_pid = getpid();
    info.si_uid = getuid();
    info.si_value.sival_int = (int)attacher;
    if (pidfd >= 0)
        r = (int)syscall(SYS_pidfd_send_signal, pidfd, p->attach_signo, &info, 0);
    else /* Linux < 5.3: checked as well as we can without a pidfd */
        r = (int)syscall(SYS_rt_sigqueueinfo, p->pid, p->attach_signo, &info);
    return r < 0 ? -errno : 0;
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
