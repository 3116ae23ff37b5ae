/* unwinder/sigmask.h: keeps libunwind's signal-mask syscalls off the unwinding path
 * (internal to unwinder/).
 *
 * libunwind (1.6, UNW_CACHE_GLOBAL) blocks all signals around every take of its cache and
 * memory-pool locks: two rt_sigprocmask syscalls each time, about 40 per warm 20-frame
 * unwind and 80% of its cost. The blocking protects against a signal handler that would
 * unwind through the same address space while the lock is held; our address spaces are
 * only ever used by the unwinder thread that owns the process, never from a handler, and
 * the service runs its unwinder threads with every signal blocked.
 *
 * unwinder/sigmask.c therefore defines sigprocmask() and pthread_sigmask() in the
 * executable (the static unwinder library is linked into it, and global.c references this
 * file so it is always pulled in). Symbols of the executable come first in the dynamic
 * lookup order, so libunwind's calls through its PLT land here. They do nothing while the
 * calling thread is inside unwinder_unwind() (a thread-local flag) and forward to the next
 * definition (libc's, or a sanitizer's interceptor) otherwise.
 *
 *     unwinder__sigmask_init();                  // once, from unwinder_global_init()
 *     unwinder__sigmask_skip = true;  ...unwind...  unwinder__sigmask_skip = false;
 */
#ifndef HP_UNWINDER_SIGMASK_H
#define HP_UNWINDER_SIGMASK_H

#include <stdbool.h>

/* True while this thread runs libunwind code that may skip the mask changes. */
extern _Thread_local bool unwinder__sigmask_skip;

/* Resolves the real functions (dlsym, so not from a hot path). Thread-safe, idempotent. */
void unwinder__sigmask_init(void);

/* Turns the bypass off (false) or on (true, the default) for the whole process; for
 * benchmarks that measure the cost it removes. Thread-safe. */
void unwinder__sigmask_set_enabled(bool enabled);

/* Whether libunwind's calls to sigprocmask() actually reach this file's definition (false
 * when the executable's symbol does not interpose, e.g. it is not exported). */
bool unwinder__sigmask_interposed(void);

#endif
