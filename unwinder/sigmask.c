/* unwinder/sigmask.c: no-op sigprocmask()/pthread_sigmask() inside unwinder_unwind();
 * see unwinder/sigmask.h. */
#include "unwinder/sigmask.h"

#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

typedef int (*sigmask_fn)(int how, const sigset_t *set, sigset_t *old);

_Thread_local bool unwinder__sigmask_skip;

/* Set once by unwinder__sigmask_init(); acquire loads pair with its release stores. */
static _Atomic(sigmask_fn) s_real_sigprocmask;
static _Atomic(sigmask_fn) s_real_pthread_sigmask;
static atomic_bool s_enabled = true;
/* Calls that reached this file while skipping, on this thread; proves the interposition
 * works. Thread-local: an atomic read-modify-write here, some 40 times per unwind, cost a
 * fifth of a warm unwind. */
static _Thread_local unsigned long s_skipped;

void unwinder__sigmask_init(void)
{
    if (!atomic_load_explicit(&s_real_sigprocmask, memory_order_acquire))
        atomic_store_explicit(&s_real_sigprocmask,
                              (sigmask_fn)(uintptr_t)dlsym(RTLD_NEXT, "sigprocmask"),
                              memory_order_release);
    if (!atomic_load_explicit(&s_real_pthread_sigmask, memory_order_acquire))
        atomic_store_explicit(&s_real_pthread_sigmask,
                              (sigmask_fn)(uintptr_t)dlsym(RTLD_NEXT, "pthread_sigmask"),
                              memory_order_release);
}

void unwinder__sigmask_set_enabled(bool enabled)
{
    atomic_store_explicit(&s_enabled, enabled, memory_order_relaxed);
}

bool unwinder__sigmask_interposed(void)
{
    /* libunwind-x86_64 imports sigprocmask from libc: call it the way it does, through a
     * lookup from another object, and see whether we got the call. */
    sigmask_fn f = (sigmask_fn)(uintptr_t)dlsym(RTLD_DEFAULT, "sigprocmask");
    if (!f)
        return false;
    bool was = unwinder__sigmask_skip;
    unsigned long before = s_skipped;
    unwinder__sigmask_skip = true;
    sigset_t none;
    sigemptyset(&none);
    (void)f(SIG_BLOCK, &none, NULL);
    unwinder__sigmask_skip = was;
    return s_skipped != before;
}

/* The skipped call reports the mask the caller would have found: the unwinder threads
 * block everything, and a caller that saves and restores gets a consistent pair. */
static bool skip(sigset_t *old)
{
    if (!unwinder__sigmask_skip || !atomic_load_explicit(&s_enabled, memory_order_relaxed))
        return false;
    if (old)
        memset(old, 0xff, sizeof(*old)); /* sigfillset(), without a call through the PLT */
    s_skipped++;
    return true;
}

int sigprocmask(int how, const sigset_t *set, sigset_t *old)
{
    if (skip(old))
        return 0;
    sigmask_fn f = atomic_load_explicit(&s_real_sigprocmask, memory_order_acquire);
    if (!f) {
        /* Called before unwinder__sigmask_init() (e.g. from a constructor). */
        unwinder__sigmask_init();
        f = atomic_load_explicit(&s_real_sigprocmask, memory_order_acquire);
    }
    if (f)
        return f(how, set, old);
    return (int)syscall(SYS_rt_sigprocmask, how, set, old, _NSIG / 8);
}

int pthread_sigmask(int how, const sigset_t *set, sigset_t *old)
{
    if (skip(old))
        return 0;
    sigmask_fn f = atomic_load_explicit(&s_real_pthread_sigmask, memory_order_acquire);
    if (!f) {
        unwinder__sigmask_init();
        f = atomic_load_explicit(&s_real_pthread_sigmask, memory_order_acquire);
    }
    if (f)
        return f(how, set, old);
    return syscall(SYS_rt_sigprocmask, how, set, old, _NSIG / 8) == 0 ? 0 : errno;
}
