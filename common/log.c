/* common/log.c: service-side logging (log.h). */
#include "common/log.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static _Atomic int log_level = -1;

static int level_from_env(void)
{
    const char *e = getenv("HEAPPROF_LOG");
    if (!e)
        return HP_LOG_WARN;
    if (!strcmp(e, "debug"))
        return HP_LOG_DEBUG;
    if (!strcmp(e, "info"))
        return HP_LOG_INFO;
    if (!strcmp(e, "error"))
        return HP_LOG_ERROR;
    return HP_LOG_WARN;
}

void hp_log_set_level(enum hp_log_level level)
{
    atomic_store_explicit(&log_level, (int)level, memory_order_relaxed);
}

enum hp_log_level hp_log_get_level(void)
{
    int l = atomic_load_explicit(&log_level, memory_order_relaxed);
    if (l < 0) {
        l = level_from_env();
        atomic_store_explicit(&log_level, l, memory_order_relaxed);
    }
    return (enum hp_log_level)l;
}

/* Writes "heapprof: " @label and the message as one line, in one write(2). */
__attribute__((format(printf, 2, 0))) static void log_line(const char *label, const char *fmt,
                                                           va_list ap)
{
    char buf[1024];
    int n = snprintf(buf, sizeof(buf), "heapprof: %s", label);
    int m = vsnprintf(buf + n, sizeof(buf) - (size_t)n - 1, fmt, ap);
    size_t len = (size_t)n +
                 (m < 0 ? 0
                        : ((size_t)m < sizeof(buf) - (size_t)n - 2 ? (size_t)m
                                                                   : sizeof(buf) - (size_t)n - 2));
    buf[len++] = '\n';
    (void)!write(STDERR_FILENO, buf, len);
}

void hp_log(enum hp_log_level level, const char *fmt, ...)
{
    static const char *const labels[] = {"debug: ", "info: ", "warning: ", "error: "};
    if ((int)level < (int)hp_log_get_level())
        return;
    va_list ap;
    va_start(ap, fmt);
    log_line(labels[level], fmt, ap);
    va_end(ap);
}

void hp_log_note(const char *fmt, ...)
{
    if (hp_log_get_level() > HP_LOG_WARN)
        return;
    va_list ap;
    va_start(ap, fmt);
    log_line("", fmt, ap);
    va_end(ap);
}
