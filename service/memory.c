/* service/memory.c: the service's own memory: what the whole process uses (from /proc),
 * what a client's ring and unwind table may take, and the guardrails (memory and CPU time)
 * that stop the profiling when the service goes past them. Beside service/budget.c, the
 * budgets of time. */
#include "service/svc_internal.h"

#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "common/log.h"
#include "shmem_ring/utable.h"

void svc__memory(struct svc_memory *ret)
{
    /* A few microseconds: the kernel keeps these counters. */
    memset(ret, 0, sizeof(*ret));
    char buf[4096];
    int fd = open("/proc/self/status", O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return;
    ssize_t n = read(fd, buf, sizeof(buf) - 1);
    (void)close(fd);
    if (n <= 0)
        return;
    buf[n] = '\0';
    const struct {
        const char *key;
        uint64_t *v;
    } keys[] = {
        {"\nVmRSS:", &ret->rss_kb}, {"\nRssShmem:", &ret->shmem_kb}, {"\nVmSwap:", &ret->swap_kb}};
    for (size_t i = 0; i < HP_ARRAY_SIZE(keys); i++) {
        const char *p = strstr(buf, keys[i].key);
        if (p)
            *keys[i].v = strtoull(p + strlen(keys[i].key), NULL, 10);
    }
}

uint64_t svc__client_mem_bytes(const struct svc *s)
{
    return s->cfg.shmem_size_bytes + 4096 + (UTABLE_DEFAULT_SLOTS + 4) * 16;
}

bool svc__guardrail_fire(struct svc *s, const char *what, uint64_t value, uint64_t limit)
{
    bool expected = false;
    if (!atomic_compare_exchange_strong_explicit(&s->guardrail_fired, &expected, true,
                                                 memory_order_acq_rel, memory_order_acquire))
        return false;
    hp_log_warn("guardrail hit: service %s %llu > limit %llu; profiling stopped, data dumped", what,
                (unsigned long long)value, (unsigned long long)limit);
    svc_detach_all(s, BK_FLAG_HIT_GUARDRAIL);
    return true;
}

bool svc_check_guardrails(svc_t *s)
{
    if (atomic_load_explicit(&s->guardrail_fired, memory_order_acquire))
        return false;
    if (s->cfg.max_heapprofd_memory_kb) {
        struct svc_memory m;
        svc__memory(&m);
        uint64_t kb = m.rss_kb + m.swap_kb;
        if (kb > s->cfg.max_heapprofd_memory_kb)
            return svc__guardrail_fire(s, "memory (KiB)", kb, s->cfg.max_heapprofd_memory_kb);
    }
    if (s->cfg.max_heapprofd_cpu_secs) {
        struct rusage ru;
        if (getrusage(RUSAGE_SELF, &ru) == 0) {
            uint64_t secs = (uint64_t)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec);
            if (secs >= s->cfg.max_heapprofd_cpu_secs)
                return svc__guardrail_fire(s, "CPU time (s)", secs, s->cfg.max_heapprofd_cpu_secs);
        }
    }
    return false;
}
