/* service/inject.h: loading libheapprof.so into a running process started without it
 * (service/inject.c), after which svc_proc_wake() attaches it as a preloaded one.
 *
 *     svc_inject_set_library("/usr/lib/x86_64-linux-gnu/libheapprof.so"); // once, at start
 *     if (!p->preloaded) r = svc_proc_inject(p, why, sizeof(why), &stats);
 *     // then svc_proc_inspect() again (the wake page is there) and svc_proc_wake()
 */
#ifndef HP_SERVICE_INJECT_H
#define HP_SERVICE_INJECT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "common/macros.h"
#include "service/rcall.h"

struct svc_proc;

/* The library to load (an absolute path; NULL or "" forgets it). */
void svc_inject_set_library(const char *path);
const char *svc_inject_library(void);

/* Loads the library into @p (inspected, not preloaded) on one thread taken at a safe
 * point. Returns 0, or a negative errno with the reason in @why: -ESRCH (exited), -EBUSY
 * (stopped, traced, a vfork child), -EOPNOTSUPP (seccomp), -EPERM (no permission to
 * trace), -ENOEXEC (static, no glibc, or the dlopen failed: its message), -ETIMEDOUT (no thread at
 * a safe point within 10 s), -EPROTO (a libheapprof.so without a wake entry is mapped), -ENOPKG (no
 * library known). @stats: the thread taken and how long it was stopped. Where the library's path
 * names another file inside the process's root (a container), it is handed over in a memfd. */
int svc_proc_inject(const struct svc_proc *p, char *why, size_t why_len,
                    struct svc_rcall_stats *stats) HP_WARN_UNUSED;
/* As svc_proc_inject(); when the library is not the same file inside the process's root
 * (a container), it is handed over in a memfd if @by_memfd, else refused (-EXDEV). */
int svc_proc_inject_ex(const struct svc_proc *p, bool by_memfd, char *why, size_t why_len,
                       struct svc_rcall_stats *stats) HP_WARN_UNUSED;

/* For the unit test: a range [lo, hi) of addresses; whether @a lies in one of @n sorted,
 * disjoint ranges; the ranges a thread of @pid must not be in to be taken (malloc'd, in
 * @ret), and the int3 the calls return to, in @trap. */
struct inject_range {
    uint64_t lo, hi;
};
bool svc__inject_in_ranges(const struct inject_range *v, size_t n, uint64_t a);
int svc__inject_unsafe_of(pid_t pid, struct inject_range **ret, size_t *n, uint64_t *trap);

#endif
