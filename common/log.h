/* common/log.h: service-side logging to stderr. Never call from the preload hook path.
 *
 *     hp_log_warn("pid %d: unwind failed: %s, sample kept", pid, strerror(-r));
 *
 * Thread-safe (each line is one write(2)).
 */
#ifndef HP_COMMON_LOG_H
#define HP_COMMON_LOG_H

enum hp_log_level { HP_LOG_DEBUG = 0, HP_LOG_INFO = 1, HP_LOG_WARN = 2, HP_LOG_ERROR = 3 };

/* Messages below @level are discarded. Default HP_LOG_WARN, or HEAPPROF_LOG=debug|info|... */
void hp_log_set_level(enum hp_log_level level);
enum hp_log_level hp_log_get_level(void);
void hp_log(enum hp_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* A line of a log the user asked for (the daemon's processes): shown unless only errors
 * are, with no level in it. */
void hp_log_note(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#define hp_log_debug(...) hp_log(HP_LOG_DEBUG, __VA_ARGS__)
#define hp_log_info(...) hp_log(HP_LOG_INFO, __VA_ARGS__)
#define hp_log_warn(...) hp_log(HP_LOG_WARN, __VA_ARGS__)
#define hp_log_error(...) hp_log(HP_LOG_ERROR, __VA_ARGS__)

#endif
