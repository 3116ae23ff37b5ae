/* service/procstate.c: what a client's threads are doing, read from /proc, so that the
 * service can tell a paused program (a debugger's breakpoint, SIGSTOP, the cgroup
 * freezer) from a broken or hostile one when a ring stalls (service/unwind_thread.c).
 * Unwinder threads only; a few small file reads, at most once per stall timeout. */
#include "service/svc_internal.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/macros.h"

/* Reads up to @len - 1 bytes of @path into @buf, NUL-terminated. Returns the length or
 * -errno. */
static ssize_t read_text(const char *path, char *buf, size_t len)
{
    HP_CLEANUP_CLOSE int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0)
        return -errno;
    ssize_t n = read(fd, buf, len - 1);
    if (n < 0)
        return -errno;
    buf[n] = '\0';
    return n;
}

/* The state letter of a /proc/.../stat line: after the last ')' (the name may hold
 * anything), or 0. */
static char stat_state(const char *stat)
{
    const char *p = strrchr(stat, ')');
    return p && p[1] == ' ' ? p[2] : 0;
}

/* True when @pid's cgroup (v2) is frozen: its cgroup.events says "frozen 1". */
static bool cgroup_frozen(pid_t pid)
{
    char path[96], buf[4096];
    snprintf(path, sizeof(path), "/proc/%d/cgroup", (int)pid);
    if (read_text(path, buf, sizeof(buf)) <= 0)
        return false;
    const char *line = strstr(buf, "0::/");
    if (!line || (line != buf && line[-1] != '\n'))
        return false;
    line += 3;
    size_t n = strcspn(line, "\n");
    char events[4096 + 64];
    if (snprintf(events, sizeof(events), "/sys/fs/cgroup%.*s/cgroup.events", (int)n, line) >=
        (int)sizeof(events))
        return false;
    char ev[512];
    if (read_text(events, ev, sizeof(ev)) <= 0)
        return false;
    const char *f = strstr(ev, "frozen ");
    return f && (f == ev || f[-1] == '\n') && f[7] == '1';
}

static bool state_stopped(char st)
{
    return st == 'T' || st == 't';
}

enum svc_thread_state svc__thread_state(pid_t pid, pid_t tid)
{
    char path[96], buf[1024];
    if (tid > 0) {
        snprintf(path, sizeof(path), "/proc/%d/task/%d/stat", (int)pid, (int)tid);
        ssize_t n = read_text(path, buf, sizeof(buf));
        if (n == -ENOENT || n == -ESRCH)
            return SVC_THREAD_GONE;
        char st = n > 0 ? stat_state(buf) : 0;
        if (st == 'Z' || st == 'X')
            return SVC_THREAD_GONE;
        if (state_stopped(st) || cgroup_frozen(pid))
            return SVC_THREAD_STOPPED;
        return SVC_THREAD_RUNNING;
    }
    snprintf(path, sizeof(path), "/proc/%d/task", (int)pid);
    DIR *d = opendir(path);
    if (!d)
        return errno == ENOENT ? SVC_THREAD_GONE : SVC_THREAD_RUNNING;
    bool stopped = false;
    struct dirent *e;
    while (!stopped && (e = readdir(d)) != NULL) {
        if (e->d_name[0] < '0' || e->d_name[0] > '9')
            continue;
        snprintf(path, sizeof(path), "/proc/%d/task/%.16s/stat", (int)pid, e->d_name);
        stopped = read_text(path, buf, sizeof(buf)) > 0 && state_stopped(stat_state(buf));
    }
    closedir(d);
    return stopped || cgroup_frozen(pid) ? SVC_THREAD_STOPPED : SVC_THREAD_RUNNING;
}

/* The kernel's PF_EXITING (include/linux/sched.h): set as a task begins to exit. */
#define PROC_PF_EXITING 0x00000004u

bool svc__stat_alive(const char *stat)
{
    char st = stat_state(stat);
    if (st == 0 || st == 'Z' || st == 'X' || st == 'x')
        return false;
    /* A process killed (or exiting) closes its descriptors before it becomes a zombie:
     * what hangs up may still be in state R or D there, but it is exiting. The flags
     * are the 6th field after the state. */
    const char *p = strrchr(stat, ')') + 2;
    for (int i = 0; i < 6 && p; i++) {
        p = strchr(p, ' ');
        if (p)
            p++;
    }
    if (!p)
        return true;
    unsigned long flags = strtoul(p, NULL, 10);
    return !(flags & PROC_PF_EXITING);
}

uint64_t svc__process_start_ts(pid_t pid)
{
    char path[64], buf[1024];
    snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
    ssize_t n = read_text(path, buf, sizeof(buf));
    if (n <= 0)
        return 0;
    const char *p = strrchr(buf, ')');
    /* after the name: state is field 3, starttime field 22 */
    for (int field = 2; p && field < 22; field++)
        p = strchr(p + 1, ' ');
    long tck = sysconf(_SC_CLK_TCK);
    if (!p || tck <= 0)
        return 0;
    /* starttime counts from boot (CLOCK_BOOTTIME, suspend included): its age now, taken
     * back from the dumps' clock. */
    uint64_t start_boot = strtoull(p + 1, NULL, 10) * (1000000000ull / (uint64_t)tck);
    uint64_t boot = hp_clock_ns(CLOCK_BOOTTIME), coarse = hp_clock_ns(CLOCK_MONOTONIC_COARSE);
    uint64_t age = boot > start_boot ? boot - start_boot : 0;
    return coarse > age ? coarse - age : 0;
}

bool svc__process_alive(pid_t pid)
{
    char path[64], buf[1024];
    snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
    if (read_text(path, buf, sizeof(buf)) <= 0)
        return false;
    return svc__stat_alive(buf);
}
