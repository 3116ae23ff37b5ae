/* tests/bench/peak_rss.c: libbench_peak_rss.so, preloaded by the overhead benchmark
 * (scripts/bench/bench_overhead.sh) to learn a program's own peak RSS when a profiler
 * stands between the benchmark and the program (heaptrack and `heapprof record` run it
 * as their child, so /usr/bin/time around them measures their whole process tree).
 *
 * At exit it appends "<pid> <comm> <VmHWM in KiB> <user+system CPU ms>\n" to the file
 * named by BENCH_PEAK_RSS_FILE (nothing when unset). It hooks nothing and allocates
 * nothing. CPU time is that of the process's threads, not of its waited-for children.
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

static long read_field(const char *text, const char *key)
{
    const char *p = strstr(text, key);
    return p ? strtol(p + strlen(key), NULL, 10) : -1;
}

__attribute__((destructor)) static void peak_rss_report(void)
{
    const char *path = getenv("BENCH_PEAK_RSS_FILE");
    if (!path || !*path)
        return;
    char status[8192], comm[64] = "?";
    int fd = open("/proc/self/status", O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return;
    ssize_t n = read(fd, status, sizeof(status) - 1);
    (void)close(fd);
    if (n <= 0)
        return;
    status[n] = 0;
    long hwm = read_field(status, "\nVmHWM:");
    if (sscanf(status, "Name:\t%63s", comm) != 1)
        strcpy(comm, "?");
    int out = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    if (out < 0)
        return;
    struct rusage ru;
    long cpu_ms = -1;
    if (getrusage(RUSAGE_SELF, &ru) == 0)
        cpu_ms = (ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) * 1000L +
                 (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1000L;
    char line[160];
    int len = snprintf(line, sizeof(line), "%d %s %ld %ld\n", (int)getpid(), comm, hwm, cpu_ms);
    if (len > 0 && write(out, line, (size_t)len) < 0) {
        /* nothing to do at exit */
    }
    (void)close(out);
}
