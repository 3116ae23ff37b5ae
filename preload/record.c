/* preload/record.c: the sampled path behind the exported malloc family (preload/hook.c):
 * the slow path the capture trampoline calls (client_alloc_slow, preload/tramp_x86_64.S),
 * the records of sampled allocations and of their frees (one by one, or in the threads'
 * batches, client.h), and the check for code loaded or unloaded that comes before them.
 *
 * Hook-safe throughout: no allocation, no stdio, no locks of ours; system calls only on
 * the sampled path (a FUTEX_WAKE when the service sleeps; checks of stack pages, once per
 * thread for its own stack, and on every sample on a stack not the thread's own, with
 * copies of such stacks; sched_yield while a sampled allocation waits for the session
 * thread's claim on the free of its address, preload/freeset.h), the session thread's
 * tgkill(pid, tid, 0) for batches of threads that have gone, and never ones that are
 * cancellation points. One lock of
 * glibc's, the loader's, taken for a few nanoseconds per sample but only when free: a
 * sample never waits for it (preload/dl.c). errno is preserved around everything we do
 * besides the real call.
 */
#include "preload/client.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/macros.h"
#include "common/sys.h"
#include "preload/got.h"
#include "preload/pyheap.h"
#include "preload/python.h"
#include "preload/stack.h"
#include "preload/walk.h"
#include "shmem_ring/wire.h"

/* The loader's record of the stack pointer at the program's entry (ld.so, GLIBC_2.2.5). */
extern void *__libc_stack_end;
#define HOOK_ENTRY_SLACK 256u

/* ---- recording -------------------------------------------------------------------- */

/* After a record could not be written (the ring is full): make sure a sleeping reader
 * hears about it. ring_end_write() wakes the reader itself; this costs a system call only
 * when the reader sleeps. No descriptor: the program cannot make us write into one of
 * its own (see shmem_ring/ring.h). */
static void hook_poke(struct client_session *s)
{
    ring_wake_reader(s->ring);
}

/* The ring was full: make sure a sleeping reader hears about it, but at most once per
 * HOOK_FULL_POKE_NS for the process. With a stopped or hung reader every sample finds
 * the ring full; a system call per dropped record would slow the program down for as
 * long as the reader stays away. */
#define HOOK_FULL_POKE_NS (1000u * 1000u)
static void hook_poke_full(struct client_session *s)
{
    uint64_t now = hp_clock_ns(CLOCK_MONOTONIC_COARSE);
    uint64_t last = atomic_load_explicit(&s->full_poke_ns, memory_order_relaxed);
    if (now - last < HOOK_FULL_POKE_NS ||
        !atomic_compare_exchange_strong_explicit(&s->full_poke_ns, &last, now, memory_order_relaxed,
                                                 memory_order_relaxed))
        return;
    hook_poke(s);
}

/* In block mode, after a wait for room ran out: looks at how far the service has read
 * and turns blocking on again once it caught up, or gives up on it for good (see
 * preload/blockstate.h). Costs a sample one relaxed load (two in block mode) until a
 * wait runs out; then a coarse clock read per sample, and a look at the ring at most
 * every CLIENT_BLOCK_CHECK_NS, by one thread at a time (a try-lock: nobody waits). */
static void hook_block_poll(struct client_session *s)
{
    struct client_block *b = &s->block;
    uint32_t m = atomic_load_explicit(&b->mode, memory_order_relaxed);
    if (HP_LIKELY(m == CLIENT_BLOCK_OFF || m == CLIENT_BLOCK_GIVEN_UP))
        return;
    if (HP_LIKELY(m == CLIENT_BLOCK_ON && ring_is_blocking(s->ring)))
        return;
    uint64_t now = hp_clock_ns(CLOCK_MONOTONIC_COARSE);
    if (m == CLIENT_BLOCK_PAUSED &&
        now < atomic_load_explicit(&b->next_check_ns, memory_order_relaxed))
        return;
    if (atomic_exchange_explicit(&b->busy, true, memory_order_acquire))
        return;
    atomic_store_explicit(&b->next_check_ns, now + CLIENT_BLOCK_CHECK_NS, memory_order_relaxed);
    struct client_block_view v = {
        .now_ns = now,
        .size = ring_size(s->ring),
        .ring_blocking = ring_is_blocking(s->ring),
    };
    ring_writer_progress(s->ring, &v.read_pos, &v.fill);
    switch (client_block_step(b, &v)) {
    case CLIENT_BLOCK_RESUME:
        ring_set_blocking(s->ring, true, s->block_timeout_us);
        ring_count_block_resume(s->ring);
        break;
    case CLIENT_BLOCK_GIVE_UP:
        ring_set_block_given_up(s->ring);
        break;
    case CLIENT_BLOCK_NONE:
        break;
    }
    atomic_store_explicit(&b->busy, false, memory_order_release);
}

/* True in a child made without our atfork handler (_Fork, clone): it must not write
 * into the parent's ring, nor change the shared state. */
static bool hook_foreign_pid(const struct client_session *s)
{
    if (HP_LIKELY(s->fork_token != NULL)) {
        if (HP_LIKELY(atomic_load_explicit(s->fork_token, memory_order_relaxed) == s->gen))
            return false;
    } else if (getpid() == s->pid) {
        return false;
    }
    atomic_fetch_add_explicit(&client_stat_foreign_pid_samples, 1, memory_order_relaxed);
    return true;
}

/* A vfork child runs on its parent's thread state: it must not leave its tid there. */
static uint32_t hook_tid(struct client_tls *t, const struct client_session *s)
{
    if (HP_LIKELY(t->tid != 0))
        return t->tid;
    uint32_t tid = (uint32_t)syscall(SYS_gettid);
    if (getpid() == s->pid)
        t->tid = tid;
    return tid;
}

/* The stack we copy belongs to the application; under AddressSanitizer parts of it are
 * poisoned redzones, and fortified memcpy checks object sizes. rep movsb is neither. */
__attribute__((no_sanitize("address"))) static void hook_copy_stack(void *dst, const void *src,
                                                                    size_t len)
{
#if defined(__x86_64__)
    __asm__ volatile("rep movsb" : "+D"(dst), "+S"(src), "+c"(len) : : "memory");
#else
    volatile const uint8_t *s = src;
    uint8_t *d = dst;
    for (size_t i = 0; i < len; i++)
        d[i] = s[i];
#endif
}

/* What a sample records: the block (its address, or the identity a heap of the
 * program's own gave it), its size, the bytes the sampler attributes to it and its heap. */
struct hook_sample {
    uint64_t addr;
    uint64_t size;
    uint64_t sample_size;
    uint32_t heap; /* 0: the malloc family */
    /* The block's set gave us a free of its address still to be recorded: the sample's
     * record carries it (WIRE_HEAD_FREE_FIRST). */
    bool free_first;
};

/* The set of @s that watches the frees of @heap's sampled blocks. */
static struct client_freeset *hook_set(struct client_session *s, uint32_t heap)
{
    return heap == 0 ? &s->freeset : &s->heap_sets[heap - 1];
}

/* The head of a sampled allocation record. */
static void hook_fill_head(struct wire_alloc_head *ret, struct client_tls *t,
                           const struct client_session *s, struct hook_sample *smp)
{
    *ret = (struct wire_alloc_head){
        .addr = smp->addr,
        .size = smp->size,
        .sample_size = smp->sample_size,
        .head_flags = smp->free_first ? WIRE_HEAD_FREE_FIRST : 0,
        .heap_id = smp->heap,
        .tid = hook_tid(t, s),
    };
}

/* After the reservation @r of a record of frees: publishes @w, or counts its @lost frees
 * as lost when the ring had no room. */
static void hook_frees_done(struct client_session *s, int r, struct ring_wspan *w, unsigned lost)
{
    if (r == 0) {
        if (ring_end_write(s->ring, w))
            hook_poke(s);
    } else if (r == -EAGAIN && lost > 0) {
        for (unsigned i = 0; i < lost; i++)
            ring_count_free_lost(s->ring);
        hook_poke_full(s);
    }
}

/* Writes a WIRE_FREE record of @addr of @heap; never waits. A free that finds no room is
 * counted as lost. Inside @s. */
static void hook_write_free(struct client_session *s, uint32_t heap, uint64_t addr)
{
    struct ring_wspan w;
    int r = ring_try_begin_write_nowait(s->ring, WIRE_FREE, sizeof(struct wire_free), &w);
    if (r == 0)
        wire_encode_free(w.data, addr, heap);
    hook_frees_done(s, r, &w, 1);
}

/* Puts sampled address @p in the set free() watches, before its record is written (no
 * other thread can free @p before the hook returns it). False when the set could not
 * take it (every level full, or no memory for the next): the sample is then dropped and
 * counted, so that no free of it can go unrecorded. */
static bool hook_watch_free(struct client_session *s, struct hook_sample *smp)
{
    int r;
    /* A block of the malloc family may have a free of its address still to be recorded
     * (preload/freeset.h): taken over, or waited for. */
    if (smp->heap == 0 && (s->features & WIRE_FEATURE_FREE_BATCH) &&
        (smp->addr & ~CLIENT_FREESET_ADDR_BITS) == 0)
        r = client_freeset_insert_taking(&s->freeset, smp->addr);
    else
        r = client_freeset_insert(hook_set(s, smp->heap), smp->addr);
    smp->free_first = r == 1;
    if (HP_LIKELY(r >= 0))
        return true;
    if (r == -EBUSY) {
        ring_count_drop(s->ring);
        return false;
    }
    atomic_fetch_add_explicit(&client_stat_freeset_overflows, 1, memory_order_relaxed);
    ring_count_freeset_full(s->ring);
    return false;
}

/* The record of @p was not written: nothing to watch. A free of its address it took over
 * goes alone. */
static void hook_unwatch_free(struct client_session *s, struct hook_sample *smp, int r)
{
    (void)client_freeset_remove(hook_set(s, smp->heap), smp->addr);
    if (smp->free_first)
        hook_write_free(s, smp->heap, smp->addr);
    if (r == -EAGAIN)
        hook_poke_full(s);
}

/* Reserves a sampled allocation's record of @type and @len payload bytes and fills its
 * head; @p is watched already. False when the ring refused it (then @p is not watched). */
static bool hook_begin_sample(struct client_tls *t, struct client_session *s, uint16_t type,
                              size_t len, struct hook_sample *smp, struct ring_wspan *ret_w,
                              struct wire_alloc_head *ret_head)
{
    int r = ring_try_begin_write(s->ring, type, len, ret_w);
    if (r < 0) {
        hook_unwatch_free(s, smp, r);
        return false;
    }
    hook_fill_head(ret_head, t, s, smp);
    return true;
}

/* pcs a walk keeps on the application's stack; a deeper walk is counted, then walked on
 * from there straight into the ring (the sampled path may run on a small fiber stack or a
 * MINSIGSTKSZ signal stack: its frames stay small). */
#define HOOK_WALK_PCS 32
/* A walk past HOOK_WALK_PCS frames is walked to its end only when the stack holds more
 * than this: a copy of a few kilobytes costs less than walking a hundred frames twice. */
#define HOOK_WALK_DEEP_BYTES (32u << 10)
/* Bytes copied at most from a stack that is not the thread's own (fiber, signal stack):
 * its end is often unknown, and such a copy is only needed until walks work there. */
#define HOOK_OTHER_STACK_MAX (64u << 10)

/* The Python frames of a sample (preload/python.h), written at the end of its record. */
struct hook_py {
    size_t n;
    uint32_t flags; /* WIRE_PYT_* */
    struct wire_py_frame frames[WIRE_MAX_PY_FRAMES];
};

/* Bytes @py adds to a record of @len bytes: 0 without frames, or when the record would
 * grow past what the ring takes (the sample goes without them). */
static size_t hook_py_len(const struct hook_py *py, size_t len)
{
    if (!py || len + wire_py_len(py->n) > RING_MAX_PAYLOAD)
        return 0;
    return wire_py_len(py->n);
}

/* Writes @py at the end of the record @w of @len bytes (@py_len from hook_py_len()). */
static void hook_put_py(struct ring_wspan *w, size_t len, const struct hook_py *py, size_t py_len)
{
    if (py_len)
        wire_encode_py((uint8_t *)w->data + len + py_len, py->frames, py->n, py->flags);
}

/* Writes the @n pcs of a walk whose first min(@n, HOOK_WALK_PCS) are in @pcs and whose
 * state after those is @rest to @dst. Returns how many it wrote: @n, or fewer when the
 * second walk of the rest failed (the table changed in between). */
static size_t hook_put_pcs(uint64_t *dst, const uint64_t *pcs, size_t n, struct client_walk *rest,
                           const struct utable *table)
{
    size_t head = n < HOOK_WALK_PCS ? n : HOOK_WALK_PCS;
    memcpy(dst, pcs, head * sizeof(uint64_t));
    if (n == head)
        return n;
    int r = client_walk_step(rest, table, dst + head, n - head, n);
    if (r == CLIENT_WALK_DONE && rest->n == n)
        return n;
    return rest->n < n ? rest->n : n - 1;
}

/* Records a sample whose stack is not the thread's own (a fiber's, a signal stack): a copy
 * that cannot fault, of as much as is there. */
static HP_NOINLINE void hook_record_other(struct client_tls *t, struct client_session *s,
                                          struct hook_sample *smp, const uint64_t *regs,
                                          const struct hook_py *py)
{
    uint64_t sp = regs[WIRE_REG_RSP];
    size_t cap = s->max_stack_bytes < HOOK_OTHER_STACK_MAX ? (size_t)s->max_stack_bytes
                                                           : HOOK_OTHER_STACK_MAX;
    struct client_stack_plan plan;
    client_stack_plan_other(&t->stack, sp, cap, &plan);
    if (!hook_watch_free(s, smp))
        return;
    struct ring_wspan w;
    struct wire_alloc_head head;
    size_t len = wire_alloc_len(plan.len, 0), py_len = hook_py_len(py, len);
    if (!hook_begin_sample(t, s, WIRE_ALLOC, len + py_len, smp, &w, &head))
        return;
    struct wire_alloc *a = w.data;
    void *stack = wire_encode_alloc(
        a, &head, sp, plan.len, WIRE_ALLOC_UNKNOWN_STACK | (py_len ? WIRE_ALLOC_PY : 0), regs, 0);
    ssize_t n = client_stack_copy(s->pid, stack, sp, plan.len);
    if (n < 0) {
        /* No way to read it safely (process_vm_readv refused): the rest of the page of
         * the return address our caller pushed, which is mapped. */
        n = (sp & 4095) ? (ssize_t)(4096 - (sp & 4095)) : 0;
        if ((size_t)n > plan.len)
            n = (ssize_t)plan.len;
        hook_copy_stack(stack, (const void *)(uintptr_t)sp, (size_t)n);
        plan.may_go_on = true;
        plan.len = (size_t)n;
    }
    /* The record keeps its length; the stack is what could be read. A signal stack's
     * frames lead to the stack the handler interrupted, which is not copied. */
    a->stack_len = (uint32_t)n;
    if (client_stack_copied_other(&t->stack, sp, &plan, (size_t)n) ||
        plan.how == CLIENT_STACK_ALTSTACK)
        a->flags |= WIRE_ALLOC_STACK_TRUNCATED;
    hook_put_py(&w, len, py, py_len);
    if (ring_end_write(s->ring, &w))
        hook_poke(s);
}

/* What hook_check_code() allows a sample. */
enum hook_code {
    HOOK_CODE_WALK, /* the counts are told: walk with the table */
    HOOK_CODE_COPY, /* the counts are unknown now: copy the stack */
    /* A change is owed and the ring took no record: no sample either (the record that
     * found no room is counted as dropped, one per sample). */
    HOOK_CODE_DROP,
};

/* Writes WIRE_MAPS_CHANGED for the changes in @untold (WIRE_MAPS_* flags and
 * CLIENT_UNTOLD_LOADED); @ret_ask: what to wait for (0: nothing). False when the ring
 * had no room. */
static bool hook_tell_code(struct client_session *s, uint32_t untold, uint64_t *ret_ask)
{
    bool loaded = untold & CLIENT_UNTOLD_LOADED;
    uint64_t ask = loaded ? ring_ask_maps_read(s->ring) : 0;
    struct ring_wspan w;
    *ret_ask = 0;
    if (ring_try_begin_write(s->ring, WIRE_MAPS_CHANGED, sizeof(struct wire_maps_changed), &w) != 0)
        return false;
    wire_encode_maps_changed(w.data, untold & WIRE_MAPS_UNLOADED, (uint32_t)ask);
    (void)ring_end_write(s->ring, &w);
    *ret_ask = ask;
    return true;
}

/* After a record that told of loaded code (@ask != 0): wakes the reader, and in block
 * mode waits until it has reread the maps. Late, or not in block mode: the service
 * rereads the maps when it gets to the record, or for the first pc it does not know;
 * code unloaded by then goes unnamed (its frames end in ERROR INVALID_MAP). */
static void hook_told_loaded(struct client_session *s, uint64_t ask)
{
    if (!ask)
        return;
    hook_poke(s); /* a sleeping reader would not come before the timeout */
    int late = ring_wait_maps_read(s->ring, ask);
    (void)late;
}

/* Takes @untold, told, out of what is owed, unless more came meanwhile (told again
 * then: the service takes a run of these records as one). */
static void hook_untold_clear(struct client_session *s, uint32_t untold)
{
    (void)atomic_compare_exchange_strong_explicit(&s->dl_untold, &untold, 0, memory_order_relaxed,
                                                  memory_order_relaxed);
}

/* Tells what an earlier sample owes. HOOK_CODE_DROP when the ring still has no room. */
static HP_NOINLINE enum hook_code hook_tell_untold(struct client_session *s, uint32_t untold)
{
    uint64_t ask;
    if (!hook_tell_code(s, untold, &ask))
        return HOOK_CODE_DROP;
    hook_untold_clear(s, untold);
    hook_told_loaded(s, ask);
    return HOOK_CODE_WALK;
}

/* Code loaded or unloaded since the session last looked (preload/dl.c) changes what the
 * service must know to name frames, and what the unwind table may say. Checked before
 * every sample's walk and record, and told in the ring before them:
 *
 *   loaded    WIRE_MAPS_CHANGED: the service rereads the maps before the samples that
 *             follow. In block mode the sample waits until it has (within the block
 *             timeout, as a sample waits for room in the ring): the new code must be seen
 *             while it is there, since it may be unloaded before the service gets to the
 *             records of its samples;
 *   unloaded  WIRE_MAPS_CHANGED with WIRE_MAPS_UNLOADED, and no walk with the table until
 *             the service started its next generation (other code may come at the
 *             addresses whose rules the table holds).
 *
 * The record goes before the counts the session keeps are updated: a thread that reads
 * the new counts in between tells too, so every sample of new code follows a record that
 * says it came. A record that finds no room (a full ring, a block wait that ran out) is
 * owed (dl_untold, flagged before the counts move): the next sample tells it, so that the
 * service, which rereads the maps when told and not for their age (it takes the maps as
 * they are now for those of records still unread), hears of every change; the sample
 * that finds it still owed goes (counted as dropped), as would its record. A stack
 * sampled now holds only code loaded when the counts were read: code unloaded later is
 * not on it (its frames would have nowhere to return to). The service keeps the mappings
 * it saw go for the records written before (unwinder_retired_seq()), so that dlclose()
 * never waits. Only with a service that speaks these records (it gave us an unwind
 * table).
 *
 * The counts come only when the loader's lock is free (preload/dl.c). When another thread
 * holds it, code may be coming or going right now: false, and this sample copies its
 * stack instead of walking it (the service unwinds the copy, and rereads the maps for a
 * pc it does not know); the next sample looks again. False also when the lock is unknown
 * here, for every sample. */
/* hook_check_code() when the counts moved from @seen_adds, @seen_subs to @adds, @subs. */
static HP_NOINLINE enum hook_code hook_code_changed(struct client_session *s, uint64_t adds,
                                                    uint64_t subs, uint64_t seen_adds,
                                                    uint64_t seen_subs)
{
    /* Counts not read at the start of the session (attach): told as loaded code, so that
     * the service rereads the maps it read at the handshake once more. */
    bool unknown = seen_adds == CLIENT_DL_UNKNOWN;
    bool unloaded = !unknown && subs != seen_subs, loaded = unknown || adds != seen_adds;
    /* With the GOT route, new objects get the hooks in their slots now (what the dlopen
     * wrapper did; preload/got.h). */
    if (loaded)
        client_got_after_load();
    /* A program that loads CPython later (an embedding plugin). */
    if (loaded && (s->features & WIRE_FEATURE_PYFRAMES) && client_py_state() == CLIENT_PY_NONE &&
        client_dl_lock_try()) {
        client_py_detect(1);
        client_dl_unlock();
    }
    if (unloaded)
        atomic_store_explicit(&s->walk_hold_gen, utable_gen(&s->utable), memory_order_relaxed);
    /* With what an earlier sample could not tell. Two threads may both tell: the service
     * takes a run of these as one. */
    uint32_t untold = atomic_load_explicit(&s->dl_untold, memory_order_relaxed) |
                      (unloaded ? WIRE_MAPS_UNLOADED : 0) | (loaded ? CLIENT_UNTOLD_LOADED : 0);
    uint64_t ask;
    bool told = hook_tell_code(s, untold, &ask);
    if (!told)
        atomic_fetch_or_explicit(&s->dl_untold, untold, memory_order_relaxed);
    /* Release: pairs with the acquire loads in hook_check_code() (the record, or the debt,
     * first). */
    atomic_store_explicit(&s->dl_adds, adds, memory_order_release);
    atomic_store_explicit(&s->dl_subs, subs, memory_order_release);
    if (!told)
        return HOOK_CODE_DROP;
    hook_untold_clear(s, untold);
    hook_told_loaded(s, ask);
    return HOOK_CODE_WALK;
}

static enum hook_code hook_check_code(struct client_session *s)
{
    uint64_t adds, subs;
    if (client_dl_counts(&adds, &subs) != CLIENT_DL_OK)
        return HOOK_CODE_COPY;
    /* Acquire: a thread that sees counts another one moved sees what that one owes. */
    uint64_t seen_adds = atomic_load_explicit(&s->dl_adds, memory_order_acquire);
    uint64_t seen_subs = atomic_load_explicit(&s->dl_subs, memory_order_acquire);
    if (HP_UNLIKELY(adds != seen_adds || subs != seen_subs))
        return hook_code_changed(s, adds, subs, seen_adds, seen_subs);
    uint32_t untold = atomic_load_explicit(&s->dl_untold, memory_order_relaxed);
    return HP_LIKELY(untold == 0) ? HOOK_CODE_WALK : hook_tell_untold(s, untold);
}

/* pre: client_session_enter(s) succeeded. */
static HP_NOINLINE void hook_record_alloc(struct client_tls *t, struct client_session *s,
                                          struct hook_sample *smp, const uint64_t *regs,
                                          const struct hook_py *py)
{
    /* The service ended the session (its socket closes next; the session thread ends it). */
    if (hook_foreign_pid(s) || ring_is_detached(s->ring))
        return;
    hook_block_poll(s);
    /* Heaps registered since the last sample: their names before their samples. */
    if (HP_UNLIKELY(atomic_load_explicit(&s->heap_names_sent, memory_order_relaxed) !=
                    atomic_load_explicit(&client_heap_count, memory_order_relaxed)))
        client__heap_names_flush(s);
    /* Without the loader's counts (its lock was taken: code may be coming or going), no
     * walk with the table: the stack is copied, for the service to unwind. A change the
     * ring had no room to tell of takes the sample with it (counted as dropped): the
     * service would name its new code with the maps it had. */
    enum hook_code code = s->utable.hdr ? hook_check_code(s) : HOOK_CODE_COPY;
    if (code == HOOK_CODE_DROP)
        return;
    bool may_walk = code == HOOK_CODE_WALK;
    uint64_t sp = regs[WIRE_REG_RSP];
    uint64_t end;
    /* The main thread's stack ends where the program's entry found it (what lies above,
     * argv, the environment and the aux vector, often kilobytes, holds no frame), plus a
     * little for the entry code's own frame; other threads' at their descriptor. */
    uint64_t main_top = (uint64_t)(uintptr_t)__libc_stack_end + HOOK_ENTRY_SLACK;
    bool own = client_stack_lookup(&t->stack, sp, (uint64_t)(uintptr_t)__builtin_thread_pointer(),
                                   main_top, &end) == CLIENT_STACK_OWN;
    if (!own)
        atomic_fetch_add_explicit(&client_stat_unknown_stacks, 1, memory_order_relaxed);

    /* With the service's unwind table, walk the stack here and send its return
     * addresses: a few hundred bytes instead of a copy of the whole stack (often
     * kilobytes), and no unwinding in the service. Every audit_every-th walk is sent
     * with the copy too, for the service to check. On a stack not the thread's own the
     * walk checks each page before it reads there. */
    uint64_t pcs[HOOK_WALK_PCS];
    struct client_walk walk, rest;
    size_t n_pcs = 0;
    bool audit = false;
    if (may_walk &&
        utable_gen(&s->utable) != atomic_load_explicit(&s->walk_hold_gen, memory_order_relaxed)) {
        client_walk_begin(&walk, &s->utable, regs, own ? end : sp + CLIENT_STACK_MAX_SPAN, own);
        int wr = client_walk_step(&walk, &s->utable, pcs, HOOK_WALK_PCS, CLIENT_WALK_MAX_FRAMES);
        rest = walk;
        /* Many frames in a short stack: copying it is cheaper (and the stack is there). */
        if (wr == CLIENT_WALK_MORE && own && end - sp <= HOOK_WALK_DEEP_BYTES)
            wr = CLIENT_WALK_FAILED;
        if (wr == CLIENT_WALK_MORE)
            wr = client_walk_step(&walk, &s->utable, NULL, CLIENT_WALK_MAX_FRAMES,
                                  CLIENT_WALK_MAX_FRAMES);
        n_pcs = wr == CLIENT_WALK_DONE ? walk.n : 0;
        audit = n_pcs > 0 && own && s->audit_every && ++t->walks % s->audit_every == 0;
    }
    if (!own && n_pcs == 0) {
        hook_record_other(t, s, smp, regs, py);
        return;
    }
    if (!hook_watch_free(s, smp))
        return;
    ring_t *ring = s->ring;
    struct ring_wspan w;
    struct wire_alloc_head head;
    if (n_pcs > 0 && !audit) {
        size_t len = wire_alloc_pcs_len(n_pcs), py_len = hook_py_len(py, len);
        uint32_t pcs_flags = py_len ? WIRE_PCS_PY : 0;
        if (!hook_begin_sample(t, s, WIRE_ALLOC_PCS, len + py_len, smp, &w, &head))
            return;
        uint64_t *dst = wire_encode_alloc_pcs(w.data, &head, n_pcs, pcs_flags);
        size_t put = hook_put_pcs(dst, pcs, n_pcs, &rest, &s->utable);
        if (put != n_pcs)
            (void)wire_encode_alloc_pcs(w.data, &head, put, pcs_flags | WIRE_PCS_PARTIAL);
        hook_put_py(&w, len, py, py_len);
        if (ring_end_write(ring, &w))
            hook_poke(s);
        return;
    }

    uint32_t flags = 0;
    uint64_t len = end - sp;
    if (len > s->max_stack_bytes) {
        len = s->max_stack_bytes;
        flags |= WIRE_ALLOC_STACK_TRUNCATED;
    }
    size_t n_audit = audit ? n_pcs : 0;
    size_t rec_len = wire_alloc_len(len, n_audit), py_len = hook_py_len(py, rec_len);
    if (py_len)
        flags |= WIRE_ALLOC_PY;
    if (!hook_begin_sample(t, s, WIRE_ALLOC, rec_len + py_len, smp, &w, &head))
        return;
    void *stack = wire_encode_alloc(w.data, &head, sp, len, flags, regs, n_audit);
    hook_copy_stack(stack, (const void *)(uintptr_t)sp, (size_t)len);
    if (n_audit &&
        hook_put_pcs(wire_alloc_audit_pcs(stack, len), pcs, n_audit, &rest, &s->utable) != n_audit)
        ((struct wire_alloc *)w.data)->flags &= ~WIRE_ALLOC_AUDIT; /* nothing to compare */
    hook_put_py(&w, rec_len, py, py_len);
    if (ring_end_write(ring, &w))
        hook_poke(s);
}

/* Tells the service what CPython the process runs (WIRE_PY_RUNTIME), once per session.
 * False when it could not (full ring): the sample goes without Python frames, whose code
 * objects the service could not check. Two threads may both tell: the service keeps the
 * last. */
static bool hook_py_tell(struct client_session *s)
{
    if (atomic_load_explicit(&s->py_told, memory_order_relaxed))
        return true;
    struct ring_wspan w;
    if (ring_try_begin_write(s->ring, WIRE_PY_RUNTIME, sizeof(struct wire_py_runtime), &w) != 0)
        return false;
    struct wire_py_runtime rt;
    client_py_runtime(&rt);
    memcpy(w.data, &rt, sizeof(rt));
    if (ring_end_write(s->ring, &w))
        hook_poke(s);
    atomic_store_explicit(&s->py_told, true, memory_order_relaxed);
    return true;
}

/* Tells the service what names the code objects of the frames of @py whose bits are set
 * in @send (WIRE_PY_CODE), those not marked sent in session epoch @epoch yet, before the
 * sample that names them: once the process freed them, or exited, the service could not
 * read them any more. The thread holds the GIL (client_py_capture()), so the objects
 * are alive and marks are its to put. A code object that cannot go (a long name, a full
 * ring) is not marked: its next sample tries again, and the service reads it meanwhile.
 * Bounded: at most one record per frame, three system calls each. */
static HP_NOINLINE void hook_py_send_codes(struct client_session *s, const struct hook_py *py,
                                           uint64_t send, uint64_t epoch)
{
    for (; send != 0; send &= send - 1) {
        const struct wire_py_frame *f = &py->frames[__builtin_ctzll(send)];
        uint32_t check = f->flags >> WIRE_PYF_CHECK_SHIFT;
        /* A function that recurses is in the sample more than once. */
        if (client_pycodes_sent(&client_py_codes, f->code, check, epoch))
            continue;
        struct client_py_code c;
        if (!client_py_code_plan(s->pid, f->code, check, &c))
            continue;
        struct ring_wspan w;
        if (ring_try_begin_write(s->ring, WIRE_PY_CODE, client_py_code_len(&c), &w) != 0)
            return;
        bool ok = client_py_code_fill(s->pid, &c, w.data);
        if (ring_end_write(s->ring, &w))
            hook_poke(s);
        if (ok)
            client_pycodes_mark_sent(&client_py_codes, f->code, check, epoch);
    }
}

/* Whether samples of @s look at Python frames: CLIENT_PY_READY, or UNSUPPORTED and not
 * told yet; CPython is looked for at the first sample of an attached session (the session
 * thread cannot), and again after code was loaded into a process without it. */
static bool hook_py_wanted(struct client_session *s)
{
    if (!(s->features & WIRE_FEATURE_PYFRAMES))
        return false;
    int st = client_py_state();
    if (HP_UNLIKELY(st == CLIENT_PY_UNKNOWN) && client_dl_lock_try()) {
        client_py_detect(0); /* takes the lock again, recursively: no wait */
        client_dl_unlock();
        st = client_py_state();
    }
    return st == CLIENT_PY_READY || (st == CLIENT_PY_UNSUPPORTED &&
                                     !atomic_load_explicit(&s->py_told, memory_order_relaxed));
}

/* hook_record_alloc() with the thread's Python frames. Their kilobyte goes on the stack
 * only when it is the thread's own (a signal stack may be small). */
static HP_NOINLINE void hook_record_alloc_py(struct client_tls *t, struct client_session *s,
                                             struct hook_sample *smp, const uint64_t *regs)
{
    if (hook_foreign_pid(s) || ring_is_detached(s->ring))
        return;
    client_pyheap_poll(s);
    uint64_t end, main_top = (uint64_t)(uintptr_t)__libc_stack_end + HOOK_ENTRY_SLACK;
    bool told = hook_py_tell(s);
    if (client_py_state() != CLIENT_PY_READY || !told ||
        client_stack_lookup(&t->stack, regs[WIRE_REG_RSP],
                            (uint64_t)(uintptr_t)__builtin_thread_pointer(), main_top,
                            &end) != CLIENT_STACK_OWN) {
        hook_record_alloc(t, s, smp, regs, NULL);
        return;
    }
    struct hook_py py;
    uint64_t send, epoch = client_pycodes_epoch(s->gen);
    py.n = client_py_capture(s->pid, regs[WIRE_REG_RSP], end, py.frames, WIRE_MAX_PY_FRAMES,
                             client_pyheap_installed(), epoch, &py.flags, &send);
    if (HP_UNLIKELY(send != 0))
        hook_py_send_codes(s, &py, send, epoch);
    hook_record_alloc(t, s, smp, regs, py.n || py.flags ? &py : NULL);
}

/* Records the free of sampled block @addr of @heap (already taken out of its set). Never
 * waits: free() must not block on the service, whatever block_client says, and this may
 * run in a signal handler that interrupted a hook of this thread, even one writing into
 * the same ring (a reservation is one compare-and-swap; the interrupted record is
 * published when the hook resumes). A free that finds no room is counted as lost: the
 * block stays live in the profile (a phantom leak), and the service says so. */
void client_record_free(struct client_session *s, uint32_t heap, uint64_t addr)
{
    struct client_tls *t = &client_tls;
    int saved_errno = errno;
    bool was_in_hook = t->in_hook, was_in_sample = t->in_sample;

    t->in_hook = true;
    t->in_sample = true;
    if (client_session_enter(s)) {
        if (!hook_foreign_pid(s))
            hook_write_free(s, heap, addr);
        client_session_leave(s);
    }
    t->in_sample = was_in_sample;
    t->in_hook = was_in_hook;
    errno = saved_errno;
}

/* ---- frees in batches (client.h) --------------------------------------------------- */

struct client_freebuf client_freebufs[CLIENT_FREEBUFS];
_Atomic uint32_t client_freebufs_back;

/* The tag of the PENDING entries batch @i fills in its epoch @epoch (preload/freeset.h):
 * 16 bits, never 0. An epoch's entries are all moved on when it is recorded, so a few
 * bits of it are enough to tell them from the next epoch's. */
static uint32_t hook_freebuf_tag(unsigned i, uint32_t epoch)
{
    _Static_assert(CLIENT_FREEBUFS << 7 < 1 << 16, "a tag takes 16 bits");
    return ((uint32_t)(i + 1) << 7) | (epoch & 127u);
}

/* Records the frees of the batch whose entries are in @slots (the malloc family's set of
 * @s, tagged @tag), in one record: reserves it, then turns each entry still PENDING with
 * the tag into a tombstone and writes its address (0 for those taken by a sampled
 * allocation or recorded by the session thread meanwhile). Entries tagged so were made by
 * the owner before it began, so every free recorded here happened before the
 * reservation, and a sampled allocation of its address either took the entry over
 * before (the commit fails) or comes after the tombstone. A batch that finds no room
 * counts its frees as lost, as client_record_free() does. Inside @s. */
static void hook_frees_commit(struct client_session *s, const uint64_t *slots, unsigned n,
                              uint32_t tag)
{
    struct ring_wspan w;
    int r = ring_try_begin_write_nowait(s->ring, WIRE_FREES, wire_frees_len(n), &w);
    uint64_t *dst = r == 0 ? wire_encode_frees(w.data, n, 0) : NULL;
    unsigned found = 0;
    for (unsigned i = 0; i < n; i++) {
        _Atomic uint64_t *slot = (_Atomic uint64_t *)(uintptr_t)slots[i];
        int level = client_freeset_slot_level(&s->freeset, slot);
        uint64_t v = level < 0 ? 0 : atomic_load_explicit(slot, memory_order_relaxed);
        uint64_t addr = 0;
        if ((v & CLIENT_FREESET_TAGS) == CLIENT_FREESET_PENDING && v != CLIENT_FREESET_TOMB &&
            v >> CLIENT_FREESET_TAG_SHIFT == tag &&
            client_freeset_commit(&s->freeset, slot, (unsigned)level, v)) {
            addr = v & CLIENT_FREESET_ADDR_BITS;
            found++;
        }
        if (dst)
            dst[i] = addr;
    }
    hook_frees_done(s, r, &w, found);
}

/* The session thread's look at a batch that may not be its own: claims each entry still
 * PENDING (whatever its tag), reserves one record for those it got, then settles them
 * (preload/freeset.h: a claim comes after the free, the record after the claim, a
 * sampled allocation of the address after the tombstone). Inside @s. */
static void hook_frees_claim(struct client_session *s, const uint64_t *slots, unsigned n)
{
    uint64_t addrs[CLIENT_FREEBUF_LEN];
    _Atomic uint64_t *mine[CLIENT_FREEBUF_LEN];
    unsigned levels[CLIENT_FREEBUF_LEN];
    unsigned k = 0;
    for (unsigned i = 0; i < n && i < CLIENT_FREEBUF_LEN; i++) {
        _Atomic uint64_t *slot = (_Atomic uint64_t *)(uintptr_t)slots[i];
        int level = client_freeset_slot_level(&s->freeset, slot);
        if (level < 0)
            continue;
        uint64_t v = atomic_load_explicit(slot, memory_order_relaxed);
        if ((v & CLIENT_FREESET_TAGS) != CLIENT_FREESET_PENDING || v == CLIENT_FREESET_TOMB ||
            !client_freeset_claim(slot, v))
            continue;
        addrs[k] = v & CLIENT_FREESET_ADDR_BITS;
        mine[k] = slot;
        levels[k++] = (unsigned)level;
    }
    if (k == 0)
        return;
    struct ring_wspan w;
    int r = ring_try_begin_write_nowait(s->ring, WIRE_FREES, wire_frees_len(k), &w);
    if (r == 0)
        memcpy(wire_encode_frees(w.data, k, 0), addrs, k * sizeof(uint64_t));
    for (unsigned i = 0; i < k; i++)
        client_freeset_settle(&s->freeset, mine[i], levels[i], addrs[i]);
    hook_frees_done(s, r, &w, k);
}

/* Enters @s flagged as recording (an allocation in a signal handler meanwhile is not
 * sampled: it could wait for a claim of ours); false when @s is over or not ours. */
static bool hook_frees_enter(struct client_tls *t, struct client_session *s, bool *ret_in_hook,
                             bool *ret_in_sample)
{
    *ret_in_hook = t->in_hook;
    *ret_in_sample = t->in_sample;
    t->in_hook = true;
    t->in_sample = true;
    if (!client_session_enter(s))
        return false;
    if (!hook_foreign_pid(s))
        return true;
    client_session_leave(s);
    return false;
}

/* Records the frees of @slots, flagged and inside @s, errno kept: those of the thread's
 * own batch of tag @tag (hook_frees_commit()), or with @tag 0 (no batch has it) any still
 * to be recorded (hook_frees_claim()). */
static void hook_frees_flagged(struct client_tls *t, struct client_session *s,
                               const uint64_t *slots, unsigned n, uint32_t tag)
{
    int saved_errno = errno;
    bool in_hook, in_sample;
    if (hook_frees_enter(t, s, &in_hook, &in_sample)) {
        if (tag)
            hook_frees_commit(s, slots, n, tag);
        else
            hook_frees_claim(s, slots, n);
        client_session_leave(s);
    }
    t->in_sample = in_sample;
    t->in_hook = in_hook;
    errno = saved_errno;
}

/* The thread's batch @b (number @i) is full: recorded, and empty again in a new epoch. */
static HP_NOINLINE void hook_freebuf_full(struct client_tls *t, struct client_session *s,
                                          struct client_freebuf *b, unsigned i)
{
    uint64_t slots[CLIENT_FREEBUF_LEN];
    for (unsigned j = 0; j < CLIENT_FREEBUF_LEN; j++)
        slots[j] = atomic_load_explicit(&b->slot[j], memory_order_relaxed);
    uint32_t tag = hook_freebuf_tag(i, b->epoch);
    b->epoch++;
    atomic_store_explicit(&b->n, 0, memory_order_relaxed);
    hook_frees_flagged(t, s, slots, CLIENT_FREEBUF_LEN, tag);
}

/* A batch for the calling thread: one nobody owns, taken by compare-and-swap. Only by the
 * thread itself (a vfork child runs on its parent's thread state: it must not take one
 * for its own tid). False when all are taken (then not again in this thread until one is
 * taken back). */
static bool hook_freebuf_take(struct client_tls *t, const struct client_session *s)
{
    uint32_t tid = hook_tid(t, s);
    if (t->tid != tid)
        return false;
    /* Before the look: a batch given back during it is looked for again next time. */
    uint32_t back = atomic_load_explicit(&client_freebufs_back, memory_order_relaxed);
    for (unsigned i = 0; i < CLIENT_FREEBUFS; i++) {
        struct client_freebuf *b = &client_freebufs[i];
        uint32_t none = 0;
        if (atomic_load_explicit(&b->owner, memory_order_relaxed) == 0 &&
            atomic_compare_exchange_strong_explicit(&b->owner, &none, tid, memory_order_acquire,
                                                    memory_order_relaxed)) {
            atomic_store_explicit(&b->n, 0, memory_order_relaxed);
            t->freebuf = (uint16_t)(i + 1);
            t->freebuf_tid = tid;
            return true;
        }
    }
    t->freebuf_none = true;
    t->freebuf_back = back;
    return false;
}

/* The thread's batch, or NULL (none to take, or in use by the code a signal handler
 * interrupted). Sets freebuf_busy when it returns one. */
static struct client_freebuf *hook_freebuf_get(struct client_tls *t, struct client_session *s)
{
    if (HP_UNLIKELY(t->freebuf_busy) ||
        (HP_UNLIKELY(t->freebuf == 0) &&
         ((t->freebuf_none &&
           atomic_load_explicit(&client_freebufs_back, memory_order_relaxed) == t->freebuf_back) ||
          !hook_freebuf_take(t, s))))
        return NULL;
    t->freebuf_busy = true;
    /* A handler that comes from here on sees the flag (it runs on this thread). */
    atomic_signal_fence(memory_order_seq_cst);
    return &client_freebufs[t->freebuf - 1];
}

void client_free_batched(struct client_session *s, uint64_t addr)
{
    /* Most frees that come here are of unsampled blocks whose filter counter was raised
     * by others: the set is looked at before anything else. */
    unsigned level;
    _Atomic uint64_t *slot = client_freeset_find(&s->freeset, addr, &level);
    if (!slot)
        return;
    struct client_tls *t = &client_tls;
    struct client_freebuf *b = hook_freebuf_get(t, s);
    if (HP_UNLIKELY(!b)) {
        if (client_freeset_remove_at(&s->freeset, slot, level, addr))
            client_record_free(s, 0, addr);
        return;
    }
    unsigned i = t->freebuf - 1;
    if (client_freeset_retire_at(&s->freeset, slot, level, addr, hook_freebuf_tag(i, b->epoch))) {
        uint32_t n = atomic_load_explicit(&b->n, memory_order_relaxed);
        /* Ours no more (taken back in a child of _Fork or clone, where our tid was the
         * parent's, by a session thread that found the parent's thread gone): this free
         * is recorded at once, and the thread goes on without a batch. */
        if (HP_UNLIKELY(atomic_load_explicit(&b->owner, memory_order_relaxed) != t->freebuf_tid ||
                        n >= CLIENT_FREEBUF_LEN)) {
            t->freebuf = 0;
            uint64_t one = (uint64_t)(uintptr_t)slot;
            hook_frees_flagged(t, s, &one, 1, 0);
        } else {
            atomic_store_explicit(&b->slot[n], (uint64_t)(uintptr_t)slot, memory_order_relaxed);
            /* Release: the session thread that reads n finds the slot. */
            atomic_store_explicit(&b->n, n + 1, memory_order_release);
            if (n + 1 == CLIENT_FREEBUF_LEN)
                hook_freebuf_full(t, s, b, i);
        }
    }
    atomic_signal_fence(memory_order_seq_cst);
    t->freebuf_busy = false;
}

void client__freebufs_forget(void)
{
    for (unsigned i = 0; i < CLIENT_FREEBUFS; i++) {
        atomic_store_explicit(&client_freebufs[i].n, 0, memory_order_relaxed);
        atomic_store_explicit(&client_freebufs[i].owner, 0, memory_order_relaxed);
    }
    client_tls.freebuf = 0;
    client_tls.freebuf_none = false;
    client_tls.freebuf_busy = false;
}

void client__freebufs_sweep(struct client_session *s, bool reclaim)
{
    struct client_tls *t = &client_tls;
    for (unsigned i = 0; i < CLIENT_FREEBUFS; i++) {
        struct client_freebuf *b = &client_freebufs[i];
        uint32_t owner = atomic_load_explicit(&b->owner, memory_order_acquire);
        if (owner == 0)
            continue;
        /* Acquire pairs with the owner's release of n: the slots below it are there (or
         * later ones: a hint either way). */
        uint32_t n = atomic_load_explicit(&b->n, memory_order_acquire);
        uint64_t slots[CLIENT_FREEBUF_LEN];
        n = n < CLIENT_FREEBUF_LEN ? n : CLIENT_FREEBUF_LEN;
        for (uint32_t j = 0; j < n; j++)
            slots[j] = atomic_load_explicit(&b->slot[j], memory_order_relaxed);
        if (n)
            hook_frees_flagged(t, s, slots, n, 0);
        /* A thread that has gone holds its batch no more: nobody uses it now. */
        if (reclaim && hp_sys3(SYS_tgkill, s->pid, (long)owner, 0) == -ESRCH) {
            atomic_store_explicit(&b->n, 0, memory_order_relaxed);
            atomic_store_explicit(&b->owner, 0, memory_order_release);
            atomic_fetch_add_explicit(&client_freebufs_back, 1, memory_order_relaxed);
        }
    }
}

/* ---- slow path -------------------------------------------------------------------- */

static void hook_seed_thread(struct client_tls *t, const struct client_session *s)
{
    uint64_t n = atomic_fetch_add_explicit(&client_thread_counter, 1, memory_order_relaxed);
    client_sampler_init(&t->sampler, &s->params, client_seed ^ client_mix64(n + 1));
    t->gen = s->gen;
    /* Looked up again for each session: a child of _Fork or clone (no atfork handler
     * reset it) that was attached would name its parent's thread otherwise. */
    t->tid = 0;
}

/* The bytes the sampler attributes to an allocation of @size that reached the slow path:
 * because the size is at least the interval (the counter was not touched), the counter
 * ran out (it was), or during a warm-up (it was not, and is still positive). 0: not
 * sampled. */
static uint64_t hook_sample_size(struct client_tls *t, const struct client_session *s,
                                 uint64_t size)
{
    if (t->gen != s->gen) {
        hook_seed_thread(t, s);
        return client_sampler_step(&t->sampler, &s->params, size);
    }
    if (size >= s->params.interval)
        return size;
    if (t->sampler.bytes_left <= 0)
        return client_sampler_refill(&t->sampler, &s->params);
    return client_sampler_step(&t->sampler, &s->params, size);
}

/* Records @smp in @s, flagged as recording (an allocation now would be a bug). */
static void hook_record(struct client_tls *t, struct client_session *s, struct hook_sample *smp,
                        const uint64_t *regs)
{
    /* Code loaded since the last look gets the hooks in its GOT slots too (only when the
     * allocator comes before us; rate-limited). */
    client_got_check();
    t->in_sample = true;
    if (hook_py_wanted(s))
        hook_record_alloc_py(t, s, smp, regs);
    else
        hook_record_alloc(t, s, smp, regs, NULL);
    t->in_sample = false;
}

uintptr_t client_alloc_slow(uintptr_t p, size_t size, uintptr_t ret, const uint64_t *regs)
{
    struct client_tls *t = &client_tls;

    if (t->in_hook) {
        if (HP_UNLIKELY(t->in_sample && client_trap_reentry))
            abort();
        return ret;
    }
    t->in_hook = true;
    int saved_errno = errno;

    if (HP_UNLIKELY(atomic_load_explicit(&client_state, memory_order_acquire) == CLIENT_UNINIT))
        client_init();
    /* Acquire pairs with the release store publishing the session. */
    struct client_session *s = atomic_load_explicit(&client_current, memory_order_acquire);
    /* Entered before reading the session: its fields stay as they are while we are
     * inside (a slot is reused only once no hook is in it). */
    if (s && client_session_enter(s)) {
        struct hook_sample smp = {.addr = p, .size = size, .heap = 0};
        smp.sample_size = hook_sample_size(t, s, size);
        /* A session that leaves the malloc heap out still counts its bytes: the sampler
         * is the thread's, shared with the program's heaps. A block that serves a Python
         * object is python.objects' (preload/pyheap.h): not recorded here too. */
        if (smp.sample_size > 0 && p != 0 && s->malloc_on &&
            HP_LIKELY(size != t->pyobj_size || t->pyobj_size == 0))
            hook_record(t, s, &smp, regs);
        client_session_leave(s);
    }

    errno = saved_errno;
    t->in_hook = false;
    return ret;
}

bool client_heap_slow(uint32_t heap, uint64_t id, uint64_t size, uint64_t sample_size,
                      const uint64_t *regs)
{
    struct client_tls *t = &client_tls;
    if (t->in_hook)
        return false;
    t->in_hook = true;
    int saved_errno = errno;
    bool sampled = false;

    struct client_session *s = atomic_load_explicit(&client_current, memory_order_acquire);
    if (s && client_session_enter(s)) {
        /* Ids 0 and 1 cannot be watched (preload/freeset.h): never sampled. */
        if (client_heap_selected(s, heap) && id > 1) {
            struct hook_sample smp = {.addr = id, .size = size, .heap = heap};
            /* A heap that samples itself: its weight as it says, the sampler untouched. */
            smp.sample_size = sample_size ? sample_size : hook_sample_size(t, s, size);
            if (smp.sample_size > 0 && client_heap_set_ready(s, heap)) {
                hook_record(t, s, &smp, regs);
                sampled = true;
            }
        }
        client_session_leave(s);
    }

    errno = saved_errno;
    t->in_hook = false;
    return sampled;
}
