/* preload/client.h: state shared by the files of libheapprof.so (internal).
 *
 * Life of the client: UNINIT -> INITIALIZING (one thread reads the environment and, when
 * asked to, does the handshake; the others pass through meanwhile) -> DORMANT (no
 * profiling asked for), ACTIVE (sampling into the ring) or PASSTHROUGH (for good: the
 * service is unreachable, refused us, went away, or this is a forked child).
 *
 *     if (atomic_load_explicit(&client_state, memory_order_acquire) == CLIENT_ACTIVE)
 *         use(client_cfg.ring);   // client_cfg is written once, before ACTIVE
 *
 * Everything here is hook-safe unless said otherwise.
 */
#ifndef HP_PRELOAD_CLIENT_H
#define HP_PRELOAD_CLIENT_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "preload/freeset.h"
#include "preload/sample.h"
#include "preload/stack.h"
#include "shmem_ring/ring.h"

#pragma GCC visibility push(hidden)

enum client_state {
    CLIENT_UNINIT = 0,
    CLIENT_INITIALIZING = 1,
    CLIENT_DORMANT = 2,
    CLIENT_ACTIVE = 3,
    CLIENT_PASSTHROUGH = 4,
};

/* Dormant threads look at the client state again after this many bytes. */
#define CLIENT_DORMANT_RECHECK_BYTES (1 << 20)
#define CLIENT_DEFAULT_INIT_TIMEOUT_MS 5000u

/* Per-thread state; initial-exec TLS, keep it small (DESIGN.md: under 1 KiB in all). */
struct client_tls {
    struct client_sampler sampler; /* bytes_left first: the fast path's only access */
    struct client_stack_cache stack;
    uint32_t tid; /* 0 until needed */
    bool in_hook; /* reentrancy guard: inside, forward to glibc at once */
    bool seeded;  /* sampler seeded for the current ACTIVE period */
};
extern __thread struct client_tls client_tls __attribute__((tls_model("initial-exec")));

/* Written once by the initialising thread before client_state becomes ACTIVE
 * (release); read after an acquire load of client_state. */
struct client_config {
    ring_t *ring;
    int sock;
    pid_t pid;
    uint64_t max_stack_bytes;
    struct client_sampler_params params;
};
extern struct client_config client_cfg;

extern _Atomic int client_state;
/* Sampling interval for the fast path: UINT64_MAX unless ACTIVE, so that every
 * allocation goes through the per-thread counter and reaches the slow path now and then. */
extern _Atomic uint64_t client_fast_interval;
/* True while ACTIVE: free() consults the sampled-address set. */
extern _Atomic bool client_free_watch;
/* Set when an insert into the set failed: from then on every free is recorded. */
extern _Atomic bool client_send_all_frees;
extern _Atomic uint64_t client_freeset_overflows;
extern struct client_freeset client_freeset;
extern _Atomic uint64_t client_seq;
extern uint64_t client_seed;
extern _Atomic uint64_t client_thread_counter;

/* Reads the environment and does the handshake when asked to; runs once. Called with the
 * caller's in_hook set, from the constructor or the first hook call, whichever comes
 * first. Not hook-safe in the strict sense: blocks up to HEAPPROF_INIT_TIMEOUT_MS. */
void client_init(void);
/* Stops profiling for good; the ring stays mapped (other threads may be writing). */
void client_go_passthrough(void);

/* Slow paths of the hooks (preload/hook.c). */
void *client_alloc_slow(void *p, size_t size);
void client_record_free(void *p);

#pragma GCC visibility pop

#endif
