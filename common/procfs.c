/* common/procfs.c: facts about a process read from /proc (common/procfs.h). */
#include "common/procfs.h"

#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

pid_t hp_status_ns_pid(const char *status, size_t len, pid_t fallback)
{
    static const char key[] = "NSpid:";
    const char *end = status + len, *l = NULL;
    for (const char *p = status; p + sizeof(key) - 1 <= end;) {
        if (memcmp(p, key, sizeof(key) - 1) == 0) {
            l = p + sizeof(key) - 1;
            break;
        }
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        if (!nl)
            break;
        p = nl + 1;
    }
    if (!l)
        return fallback;
    /* Tab-separated pids, outermost namespace first. */
    int64_t last = -1;
    while (l < end && *l != '\n') {
        if (*l == '\t' || *l == ' ') {
            l++;
            continue;
        }
        int64_t v = 0;
        const char *digits = l;
        while (l < end && *l >= '0' && *l <= '9' && v <= INT32_MAX)
            v = v * 10 + (*l++ - '0');
        if (l == digits || v > INT32_MAX)
            return fallback;
        last = v;
    }
    return last > 0 ? (pid_t)last : fallback;
}

pid_t hp_proc_ns_pid(pid_t pid)
{
    char path[64], buf[4096];
    snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return pid;
    size_t n = 0;
    ssize_t r;
    while (n < sizeof(buf) && (r = read(fd, buf + n, sizeof(buf) - n)) > 0)
        n += (size_t)r;
    (void)close(fd);
    return hp_status_ns_pid(buf, n, pid);
}
