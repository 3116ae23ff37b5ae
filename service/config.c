/* service/config.c: the session configuration (Perfetto HeapprofdConfig names) and its
 * checks. */
#include <ctype.h>
#include <errno.h>
#include <fnmatch.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "service/svc.h"
#include "shmem_ring/ring.h"

void svc_config_init(struct svc_config *cfg)
{
    memset(cfg, 0, sizeof(*cfg));
    cfg->sampling_interval_bytes = 4096;
    cfg->shmem_size_bytes = RING_DEFAULT_SIZE;
    cfg->max_stack_bytes = 64u << 10;
    cfg->audit_every = 1024;
    cfg->block_client_timeout_us = 100000;
}

void svc_config_done(struct svc_config *cfg)
{
    for (size_t i = 0; i < cfg->n_process_cmdline; i++)
        free(cfg->process_cmdline[i]);
    cfg->n_process_cmdline = 0;
}

int svc_config_check(const struct svc_config *cfg, char *err, size_t err_len)
{
    uint64_t n = cfg->shmem_size_bytes;
    if (cfg->sampling_interval_bytes == 0) {
        snprintf(err, err_len, "sampling_interval_bytes must be at least 1");
        return -EINVAL;
    }
    if (n < RING_MIN_SIZE || n > RING_MAX_SIZE || (n & (n - 1)) != 0) {
        snprintf(err, err_len,
                 "shmem_size_bytes must be a power of two between %u and %u, not %llu",
                 RING_MIN_SIZE, RING_MAX_SIZE, (unsigned long long)n);
        return -EINVAL;
    }
    if (cfg->max_stack_bytes < 1024 || cfg->max_stack_bytes > (1u << 19) ||
        cfg->max_stack_bytes % 8 != 0) {
        snprintf(err, err_len, "max stack copy must be a multiple of 8 between 1 KiB and 512 KiB");
        return -EINVAL;
    }
    if (cfg->dump_interval_ms != 0 && cfg->dump_interval_ms < 10) {
        snprintf(err, err_len, "dump_interval_ms must be 0 (off) or at least 10");
        return -EINVAL;
    }
    if (cfg->max_stack_bytes + 4096 > n / 4) {
        snprintf(err, err_len, "shmem_size_bytes %llu is too small for %llu-byte stack copies",
                 (unsigned long long)n, (unsigned long long)cfg->max_stack_bytes);
        return -EINVAL;
    }
    return 0;
}

bool svc_config_has_targets(const struct svc_config *cfg)
{
    return cfg->all || cfg->n_pid > 0 || cfg->n_process_cmdline > 0;
}

bool svc_config_matches(const struct svc_config *cfg, int32_t pid, const char *cmdline, size_t len)
{
    if (cfg->all)
        return true;
    for (size_t i = 0; i < cfg->n_pid; i++)
        if (cfg->pid[i] == pid)
            return true;
    if (!cmdline || len == 0)
        return false;
    /* argv[0], NUL-terminated within @len */
    size_t a0 = strnlen(cmdline, len);
    if (a0 == len || a0 == 0)
        return false;
    const char *base = strrchr(cmdline, '/');
    base = base ? base + 1 : cmdline;
    for (size_t i = 0; i < cfg->n_process_cmdline; i++) {
        const char *t = cfg->process_cmdline[i];
        if (!strcmp(t, cmdline) || !strcmp(t, base))
            return true;
        if (fnmatch(t, cmdline, 0) == 0 || fnmatch(t, base, 0) == 0)
            return true;
    }
    return false;
}
