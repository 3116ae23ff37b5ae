/* service/rcall.h: remote calls in one thread of another process, by ptrace
 * (service/wake.c), for the wake and the injection of libheapprof.so (service/inject.c).
 *
 * svc__rcall_run() takes the threads of @pid one at a time, best first (idle in a system
 * call a stop restarts transparently, then running), never stopping the others: it seizes
 * and interrupts one, checks it (not inside an rseq section, @headroom bytes of stack below
 * its sp, and the plan's own safe() on its pc and stack), saves its registers, extended
 * state and signal mask, blocks every signal but SIGTRAP, and runs the plan's act(), which
 * makes calls with svc__rcall_call(). Each call returns to @trap, an int3 in the target's
 * code. Then everything is put back exactly (an interrupted system call restarted as the
 * kernel would, or exactly when our stop ended it with EINTR) and the thread detached.
 *
 *     static int act(struct svc_rcall *t, void *arg)
 *     {
 *         uint64_t at, ret;
 *         int r = svc__rcall_put(t, "text", 5, &at);
 *         return r < 0 ? r : svc__rcall_call(t, fn_addr, at, 0, 0, &ret);
 *     }
 *     struct svc_rcall_plan plan = {.trap = int3_addr, .headroom = 65536, .act = act,
 *                                   .choose_ns = 5000000000ull};
 *     r = svc__rcall_run(pid, &plan, why, sizeof(why), &stats);
 *
 * Same caller rules as svc_proc_wake() (service/targets.h): the calling thread is the
 * tracer; children are reaped only from it.
 */
#ifndef HP_SERVICE_RCALL_H
#define HP_SERVICE_RCALL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "common/macros.h"

struct svc_rcall; /* the thread taken, inside act() */

struct svc_rcall_plan {
    uint64_t trap;     /* an int3 in the target's executable code */
    uint32_t headroom; /* stack the calls and their data need below sp */
    uint64_t choose_ns;
    /* Optional: false when the stopped thread at @rip/@rsp is not at a safe point (it is
     * released untouched and another one tried). */
    bool (*safe)(void *arg, pid_t tid, uint64_t rip, uint64_t rsp);
    /* The work: 0, or a negative errno with the reason in the why buffer. */
    int (*act)(struct svc_rcall *t, void *arg);
    void *arg;
};

struct svc_rcall_stats {
    pid_t tid;         /* the thread taken */
    uint64_t stop_ns;  /* how long it was stopped, interrupt to detach */
    uint64_t total_ns; /* the whole svc__rcall_run() */
};

/* Returns 0, -ETIMEDOUT (no thread was safe within choose_ns), -ESRCH, -EPERM and the
 * like (reason in @why), or act()'s error. */
int svc__rcall_run(pid_t pid, const struct svc_rcall_plan *plan, char *why, size_t why_len,
                   struct svc_rcall_stats *stats) HP_WARN_UNUSED;

/* Writes the reason @fmt into @why (when not NULL and @len > 0); returns @r. */
int svc__why(char *why, size_t len, int r, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* Refuses (negative errno, reason in @why) a process that is stopped, traced, ignores
 * SIGTRAP, or runs a thread under seccomp. */
int svc__rcall_preflight(pid_t pid, char *why, size_t len) HP_WARN_UNUSED;

/* Inside act(): copies @len bytes below the frames to come; their address in @addr. */
int svc__rcall_put(struct svc_rcall *t, const void *data, size_t len,
                   uint64_t *addr) HP_WARN_UNUSED;

/* Inside act(): calls @fn(@a0, @a1, @a2); its rax in @ret. Returns 0, -ESRCH or -EIO. */
int svc__rcall_call(struct svc_rcall *t, uint64_t fn, uint64_t a0, uint64_t a1, uint64_t a2,
                    uint64_t *ret) HP_WARN_UNUSED;

/* Inside act(): reads or writes the target's memory. 0 or -EIO. */
int svc__rcall_read(struct svc_rcall *t, uint64_t addr, void *buf, size_t len) HP_WARN_UNUSED;
int svc__rcall_write(struct svc_rcall *t, uint64_t addr, const void *buf,
                     size_t len) HP_WARN_UNUSED;

#endif
