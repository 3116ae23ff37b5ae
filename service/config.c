/* service/config.c: the session configuration (Perfetto HeapprofdConfig names) and its
 * checks. */
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "service/cmds.h"
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

int svc_parse_bytes(const char *s, uint64_t *ret)
{
    if (!s || !isdigit((unsigned char)s[0]))
        return -EINVAL;
    uint64_t v = 0;
    const char *p = s;
    for (; isdigit((unsigned char)*p); p++) {
        unsigned d = (unsigned)(*p - '0');
        if (v > (UINT64_MAX - d) / 10)
            return -EINVAL;
        v = v * 10 + d;
    }
    uint64_t mult = 1;
    switch (*p) {
    case '\0':
        break;
    case 'k':
    case 'K':
        mult = 1ull << 10;
        p++;
        break;
    case 'm':
    case 'M':
        mult = 1ull << 20;
        p++;
        break;
    case 'g':
    case 'G':
        mult = 1ull << 30;
        p++;
        break;
    default:
        return -EINVAL;
    }
    if (*p == 'i' && mult > 1)
        p++;
    if ((*p == 'b' || *p == 'B') && p[1] == '\0')
        p++;
    if (*p != '\0' || v == 0 || v > UINT64_MAX / mult)
        return -EINVAL;
    *ret = v * mult;
    return 0;
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

int parse_continuous_dump(const char *arg, struct svc_config *cfg)
{
    char *end;
    errno = 0;
    unsigned long iv = strtoul(arg, &end, 10);
    unsigned long ph = 0;
    if (errno || end == arg || iv < 10 || iv > UINT32_MAX || arg[0] == '-')
        return -EINVAL;
    if (*end == ',') {
        const char *p = end + 1;
        ph = strtoul(p, &end, 10);
        if (errno || end == p || ph > UINT32_MAX || p[0] == '-')
            return -EINVAL;
    }
    if (*end)
        return -EINVAL;
    cfg->dump_interval_ms = (uint32_t)iv;
    cfg->dump_phase_ms = (uint32_t)ph;
    return 0;
}
