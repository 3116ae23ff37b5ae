/* service/config.c: the session configuration (Perfetto HeapprofdConfig names) and its
 * checks. */
#include "service/config.h"

#include <ctype.h>
#include <errno.h>
#include <fnmatch.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "shmem_ring/ring.h"
#include "shmem_ring/wire.h"

void svc_config_init(struct svc_config *cfg)
{
    memset(cfg, 0, sizeof(*cfg));
    cfg->sampling_interval_bytes = 4096;
    cfg->shmem_size_bytes = RING_DEFAULT_SIZE;
    cfg->max_stack_bytes = 0; /* svc_config_max_stack() */
    cfg->audit_every = 1024;
    cfg->block_client_timeout_us = 100000;
}

void svc_config_done(struct svc_config *cfg)
{
    for (size_t i = 0; i < cfg->n_process_cmdline; i++)
        free(cfg->process_cmdline[i]);
    cfg->n_process_cmdline = 0;
}

/* ---- the field table ---------------------------------------------------------------- */

/* The longest command line matched as a title (pgrep -f reads as much). */
#define MAX_TITLE 4096

#define FIELD(member) offsetof(struct svc_config, member), sizeof(((struct svc_config *)0)->member)

const struct svc_config_field svc_config_fields[] = {
    {"sampling_interval_bytes", 1, SVC_FIELD_BYTES, SVC_FIELD_NONZERO,
     FIELD(sampling_interval_bytes), 1, UINT64_MAX, "sampling-interval", 'i', NULL,
     "sampling interval", "N",
     "mean bytes between samples (default 4096; 1 records every allocation); suffixes k, M, "
     "G accepted"},
    {"process_cmdline", 2, SVC_FIELD_CMDLINES, 0, 0, 0, 0, 0, "process-cmdline", 'n', NULL,
     "process name", "NAME",
     "processes whose name (comm), argv[0], its basename or title (as pgrep -f sees it) "
     "equals NAME or matches it as a glob (repeatable)"},
    {"pid", 4, SVC_FIELD_PIDS, SVC_FIELD_NONZERO, 0, 0, 1, INT32_MAX, "pid", 'p', NULL, "pid",
     "PID", "profile this process (repeatable)"},
    {"all", 5, SVC_FIELD_BOOL, 0, FIELD(all), 0, 1, "all", 0, NULL, "all", NULL,
     "profile every process that connects"},
    {"continuous_dump_config.dump_phase_ms", 5, SVC_FIELD_UINT, SVC_FIELD_NESTED_DUMP,
     FIELD(dump_phase_ms), 0, UINT32_MAX, NULL, 0, NULL, "dump phase", "MS",
     "first continuous dump this long after the start"},
    {"continuous_dump_config.dump_interval_ms", 6, SVC_FIELD_UINT, SVC_FIELD_NESTED_DUMP,
     FIELD(dump_interval_ms), 0, UINT32_MAX, NULL, 0, NULL, "dump interval", "MS",
     "dump every MS milliseconds (0: no continuous dumps)"},
    {"shmem_size_bytes", 8, SVC_FIELD_BYTES, SVC_FIELD_POW2, FIELD(shmem_size_bytes), RING_MIN_SIZE,
     RING_MAX_SIZE, "shmem-size", 0, NULL, "shared buffer size", "N",
     "shared buffer per process, power of two (default 8M)"},
    {"block_client", 9, SVC_FIELD_BOOL, 0, FIELD(block_client), 0, 1, "block-client", 0,
     "no-block-client", "block_client", NULL,
     "make the app wait for buffer space instead of dropping samples (bounded by "
     "--block-timeout-us)"},
    {"no_startup", 10, SVC_FIELD_BOOL, 0, FIELD(no_startup), 0, 1, "no-startup", 0, NULL,
     "no_startup", NULL, "ignore processes connecting at startup"},
    {"no_running", 11, SVC_FIELD_BOOL, 0, FIELD(no_running), 0, 1, "no-running", 0, NULL,
     "no_running", NULL, "do not attach running processes"},
    {"dump_at_max", 13, SVC_FIELD_BOOL, 0, FIELD(dump_at_max), 0, 1, "dump-at-max", 0, NULL,
     "dump_at_max", NULL, "report live memory at its peak, not at the end"},
    {"block_client_timeout_us", 14, SVC_FIELD_UINT, 0, FIELD(block_client_timeout_us), 0, 60000000,
     "block-timeout-us", 0, NULL, "block timeout", "N",
     "longest wait for buffer space, in microseconds (default 100000; the client waits at most "
     "10000000); after a wait that runs out, samples are dropped (counted) until the service "
     "caught up, or for the rest of the session when it reads nothing for 5 s (the dump says "
     "CLIENT_ERROR_HIT_TIMEOUT)"},
    {"max_heapprofd_memory_kb", 16, SVC_FIELD_UINT, 0, FIELD(max_heapprofd_memory_kb), 0,
     UINT64_MAX / 1024, "max-memory-kb", 0, NULL, "memory guardrail", "N",
     "guardrail: stop profiling when the service uses more memory (KiB; 0: none)"},
    {"max_heapprofd_cpu_secs", 17, SVC_FIELD_UINT, 0, FIELD(max_heapprofd_cpu_secs), 0, UINT64_MAX,
     "max-cpu-secs", 0, NULL, "CPU guardrail", "N",
     "guardrail: stop profiling when the service used more CPU (seconds; 0: none)"},
    {"disable_fork_teardown", 18, SVC_FIELD_BOOL, 0, FIELD(disable_fork_teardown), 0, 1,
     "disable-fork-teardown", 0, NULL, "disable_fork_teardown", NULL, "disable_fork_teardown"},
    {"heaps", 20, SVC_FIELD_HEAPS, 0, 0, 0, 0, 0, "heaps", 0, NULL, "heap", "NAME,...",
     "record these heaps (repeatable): \"libc.malloc\" (the malloc family), \"python.objects\" "
     "(CPython 3.11's objects; both by default) and "
     "the program's own, as it registered them (heapprof.h)"},
    {"all_heaps", 21, SVC_FIELD_BOOL, 0, FIELD(all_heaps), 0, 1, "all-heaps", 0, NULL, "all_heaps",
     NULL, "record every heap: malloc's and all the program registers"},
    /* heapprof's own fields */
    {"max_stack_bytes", 0, SVC_FIELD_BYTES, 0, FIELD(max_stack_bytes), 1024, 1u << 19, "max-stack",
     0, NULL, "stack copy size", "N",
     "most bytes of stack copied per sample (default 512k, less for small rings)"},
    {"follow_fork", 0, SVC_FIELD_BOOL, 0, FIELD(follow_fork), 0, 1, "follow-fork", 0,
     "no-follow-fork", "follow_fork", NULL,
     "also profile children of fork() until they exec, each as its own process"},
    {"no_source_lines", 0, SVC_FIELD_BOOL, 0, FIELD(no_source_lines), 0, 1, "no-source-lines", 0,
     NULL, "no_source_lines", NULL,
     "leave source files and lines out of the trace (no debug information is read: faster "
     "dumps, function names only)"},
    {"no_fast_unwind", 0, SVC_FIELD_BOOL, 0, FIELD(no_fast_unwind), 0, 1, "no-fast-unwind", 0, NULL,
     "no_fast_unwind", NULL,
     "copy every sampled stack for the service to unwind (by default the app walks its own "
     "stack once the service has published the rules)"},
    {"audit_every", 0, SVC_FIELD_UINT, 0, FIELD(audit_every), 0, UINT32_MAX, "audit-every", 0, NULL,
     "audit rate", "N",
     "check every Nth stack a thread walked itself against an unwind of its copy (default "
     "1024; 0: never)"},
    {"unwinder_threads", 0, SVC_FIELD_UINT, 0, FIELD(unwinder_threads), 0, 8, "unwinder-threads", 0,
     NULL, "unwinder threads", "N",
     "threads that read and unwind the profiled processes' samples (default: one per CPU, at "
     "most 8)"},
    {"allow_other_users", 0, SVC_FIELD_BOOL, 0, FIELD(allow_other_users), 0, 1, "allow-other-users",
     0, NULL, "allow_other_users", NULL,
     "as root, also profile other users' processes (over a socket they can reach)"},
};
const size_t svc_n_config_fields = HP_ARRAY_SIZE(svc_config_fields);

const struct svc_config_field *svc_config_field_find(const char *name)
{
    for (size_t i = 0; i < svc_n_config_fields; i++)
        if (!strcmp(svc_config_fields[i].name, name))
            return &svc_config_fields[i];
    return NULL;
}

static void *field_ptr(struct svc_config *cfg, const struct svc_config_field *f)
{
    return (char *)cfg + f->offset;
}

int svc_config_set_uint(struct svc_config *cfg, const struct svc_config_field *f, uint64_t v,
                        char *err, size_t err_len)
{
    if ((f->flags & SVC_FIELD_NONZERO) && v == 0) {
        snprintf(err, err_len, "%s must be at least 1", f->name);
        return -EINVAL;
    }
    if ((f->flags & SVC_FIELD_POW2) && (v < f->min || v > f->max || (v & (v - 1)) != 0)) {
        snprintf(err, err_len, "%s must be a power of two between %llu and %llu", f->name,
                 (unsigned long long)f->min, (unsigned long long)f->max);
        return -EINVAL;
    }
    if (v < f->min || v > f->max) {
        snprintf(err, err_len, "%s must be between %llu and %llu", f->name,
                 (unsigned long long)f->min, (unsigned long long)f->max);
        return -EINVAL;
    }
    switch (f->type) {
    case SVC_FIELD_PIDS:
        if (cfg->n_pid >= SVC_MAX_TARGETS) {
            snprintf(err, err_len, "more than %d pids", SVC_MAX_TARGETS);
            return -EINVAL;
        }
        cfg->pid[cfg->n_pid++] = (int32_t)v;
        return 0;
    case SVC_FIELD_UINT:
    case SVC_FIELD_BYTES:
        if (f->width == sizeof(uint32_t))
            *(uint32_t *)field_ptr(cfg, f) = (uint32_t)v;
        else
            *(uint64_t *)field_ptr(cfg, f) = v;
        return 0;
    default:
        snprintf(err, err_len, "%s is not a number", f->name);
        return -EINVAL;
    }
}

void svc_config_set_bool(struct svc_config *cfg, const struct svc_config_field *f, bool v)
{
    if (f->type == SVC_FIELD_BOOL)
        *(bool *)field_ptr(cfg, f) = v;
}

/* Adds the comma-separated heap names in @v to cfg->heaps ("malloc" is "libc.malloc"). */
static int set_heaps(struct svc_config *cfg, const char *v, char *err, size_t err_len)
{
    for (const char *p = v;; p++) {
        size_t len = strcspn(p, ",");
        char name[SVC_HEAP_NAME_MAX];
        if (len == 0 || len >= sizeof(name)) {
            snprintf(err, err_len, "a heap name has 1 to %d characters", SVC_HEAP_NAME_MAX - 1);
            return -EINVAL;
        }
        memcpy(name, p, len);
        name[len] = '\0';
        if (!strcmp(name, "malloc"))
            snprintf(name, sizeof(name), "libc.malloc");
        bool seen = false;
        for (size_t i = 0; i < cfg->n_heaps && !seen; i++)
            seen = !strcmp(cfg->heaps[i], name);
        if (!seen) {
            if (cfg->n_heaps >= SVC_MAX_HEAPS) {
                snprintf(err, err_len, "more than %d heaps", SVC_MAX_HEAPS);
                return -EINVAL;
            }
            memcpy(cfg->heaps[cfg->n_heaps++], name, strlen(name) + 1);
        }
        p += len;
        if (!*p)
            return 0;
    }
}

bool svc_config_records_heap(const struct svc_config *cfg, const char *name)
{
    if (cfg->all_heaps)
        return true;
    if (cfg->n_heaps == 0)
        return !strcmp(name, WIRE_HEAP_MALLOC_NAME) || !strcmp(name, WIRE_HEAP_PYTHON_NAME);
    for (size_t i = 0; i < cfg->n_heaps; i++)
        if (!strcmp(cfg->heaps[i], name))
            return true;
    return false;
}

int svc_config_set_string(struct svc_config *cfg, const struct svc_config_field *f, const char *v,
                          char *err, size_t err_len)
{
    if (!*v) {
        snprintf(err, err_len, "%s must not be empty", f->name);
        return -EINVAL;
    }
    if (f->type == SVC_FIELD_HEAPS)
        return set_heaps(cfg, v, err, err_len);
    if (f->type != SVC_FIELD_CMDLINES) {
        snprintf(err, err_len, "%s is not a string", f->name);
        return -EINVAL;
    }
    if (cfg->n_process_cmdline >= SVC_MAX_TARGETS) {
        snprintf(err, err_len, "more than %d process_cmdline entries", SVC_MAX_TARGETS);
        return -EINVAL;
    }
    char *copy = strdup(v);
    if (!copy) {
        snprintf(err, err_len, "out of memory");
        return -ENOMEM;
    }
    cfg->process_cmdline[cfg->n_process_cmdline++] = copy;
    return 0;
}

int svc_config_set_text(struct svc_config *cfg, const struct svc_config_field *f, const char *text,
                        char *err, size_t err_len)
{
    uint64_t v;
    switch (f->type) {
    case SVC_FIELD_BOOL:
    case SVC_FIELD_ACCEPTED:
        svc_config_set_bool(cfg, f, true);
        return 0;
    case SVC_FIELD_CMDLINES:
    case SVC_FIELD_HEAPS:
        return svc_config_set_string(cfg, f, text, err, err_len);
    case SVC_FIELD_UINT:
    case SVC_FIELD_BYTES:
    case SVC_FIELD_PIDS:
        if (svc_parse_uint(text, f->type == SVC_FIELD_BYTES, &v) < 0) {
            snprintf(err, err_len, "expected %s%s",
                     f->type == SVC_FIELD_BYTES ? "a number of bytes" : "a number",
                     f->type == SVC_FIELD_BYTES ? " (e.g. 4096, 512k)" : "");
            return -EINVAL;
        }
        return svc_config_set_uint(cfg, f, v, err, err_len);
    }
    return -EINVAL;
}

int svc_parse_uint(const char *s, bool suffixes, uint64_t *ret)
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
    if (suffixes) {
        switch (*p) {
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
            break;
        }
        if (*p == 'i' && mult > 1)
            p++;
        if ((*p == 'b' || *p == 'B') && p[1] == '\0')
            p++;
    }
    if (*p != '\0' || v > UINT64_MAX / mult)
        return -EINVAL;
    *ret = v * mult;
    return 0;
}

/* ---- checks ---------------------------------------------------------------------- */

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
    if (cfg->max_stack_bytes != 0 &&
        (cfg->max_stack_bytes < 1024 || cfg->max_stack_bytes > (1u << 19) ||
         cfg->max_stack_bytes % 8 != 0)) {
        snprintf(err, err_len, "max stack copy must be a multiple of 8 between 1 KiB and 512 KiB");
        return -EINVAL;
    }
    if (cfg->dump_interval_ms != 0 && cfg->dump_interval_ms < 10) {
        snprintf(err, err_len, "dump_interval_ms must be 0 (off) or at least 10");
        return -EINVAL;
    }
    if (cfg->max_stack_bytes != 0 && cfg->max_stack_bytes + 4096 > n / 4) {
        snprintf(err, err_len, "shmem_size_bytes %llu is too small for %llu-byte stack copies",
                 (unsigned long long)n, (unsigned long long)cfg->max_stack_bytes);
        return -EINVAL;
    }
    return 0;
}

uint64_t svc_config_max_stack(const struct svc_config *cfg)
{
    if (cfg->max_stack_bytes != 0)
        return cfg->max_stack_bytes;
    /* A copy takes only what the stack holds, so a high cap costs nothing for the usual
     * stack of a few kilobytes, and deep ones (a compiler's, hundreds of kilobytes) come
     * out whole; a record stays within a quarter of the ring, like a configured cap. */
    uint64_t fit = (cfg->shmem_size_bytes / 4 - 4096) & ~(uint64_t)7;
    return fit < SVC_DEFAULT_MAX_STACK_BYTES ? fit : SVC_DEFAULT_MAX_STACK_BYTES;
}

bool svc_config_has_targets(const struct svc_config *cfg)
{
    return cfg->all || cfg->n_pid > 0 || cfg->n_process_cmdline > 0;
}

size_t svc_cmdline_title(const char *cmdline, size_t len, char *buf, size_t buf_len)
{
    if (buf_len == 0)
        return 0;
    while (len > 0 && (cmdline[len - 1] == '\0' || cmdline[len - 1] == ' '))
        len--; /* the padding of a retitled process (NULs for nginx, spaces for redis) */
    size_t n = len < buf_len - 1 ? len : buf_len - 1;
    for (size_t i = 0; i < n; i++)
        buf[i] = cmdline[i] ? cmdline[i] : ' ';
    buf[n] = '\0';
    return n;
}

/* True when @name equals @t or matches it as a glob. */
static bool name_matches(const char *t, const char *name)
{
    return name[0] && (!strcmp(t, name) || fnmatch(t, name, 0) == 0);
}

bool svc_config_matches(const struct svc_config *cfg, int32_t pid, const char *comm,
                        const char *cmdline, size_t len)
{
    if (cfg->all)
        return true;
    for (size_t i = 0; i < cfg->n_pid; i++)
        if (cfg->pid[i] == pid)
            return true;
    /* argv[0], NUL-terminated within @len */
    size_t a0 = cmdline && len ? strnlen(cmdline, len) : len;
    bool have_cmdline = a0 < len && a0 > 0;
    if (!have_cmdline && !(comm && comm[0]))
        return false;
    const char *base = have_cmdline ? strrchr(cmdline, '/') : NULL;
    base = base ? base + 1 : have_cmdline ? cmdline : "";
    char title[MAX_TITLE];
    if (have_cmdline)
        svc_cmdline_title(cmdline, len, title, sizeof(title));
    else
        title[0] = '\0';
    for (size_t i = 0; i < cfg->n_process_cmdline; i++) {
        const char *t = cfg->process_cmdline[i];
        if ((comm && name_matches(t, comm)) ||
            (have_cmdline &&
             (name_matches(t, cmdline) || name_matches(t, base) || name_matches(t, title))))
            return true;
    }
    return false;
}
