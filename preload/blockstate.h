/* preload/blockstate.h: when a client in block mode (block_client) waits for the service
 * again after a wait for room ran out.
 *
 * A wait that runs out (the block timeout, 100 ms by default) ends blocking in the ring:
 * the service is stopped, hung, or only slow for a moment (a start that parses a big
 * binary, a loaded machine). Samples are then dropped (counted), frees keep the room the
 * ring saves for them. This state machine turns blocking on again once the service has
 * caught up, and gives up for good only on a service that made no progress at all for
 * CLIENT_BLOCK_GIVE_UP_NS:
 *
 *     ON ----(the ring ended blocking)----> PAUSED --(the reader moved since the pause,
 *      ^                                      |        and the ring is at most half full
 *      +------------- RESUME -----------------+        or it read a quarter ring since)
 *                                             |
 *                                             +--(its position unchanged for
 *                                                 CLIENT_BLOCK_GIVE_UP_NS)--> GIVEN_UP
 *
 * client_block_step() is pure (the caller passes the time and what the ring shows) and
 * not thread-safe: hook_block_poll() (preload/record.c) runs it under a try-lock, at
 * most once per CLIENT_BLOCK_CHECK_NS while PAUSED.
 */
#ifndef HP_PRELOAD_BLOCKSTATE_H
#define HP_PRELOAD_BLOCKSTATE_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

/* A service whose read position has not moved for this long is stopped or hung: the
 * client drops for the rest of the session (as with no block mode at all). Above the
 * longest block timeout that sanitizer builds need now and then. */
#define CLIENT_BLOCK_GIVE_UP_NS (5000ull * 1000 * 1000)
/* While PAUSED, samples look at the ring at most this often (one clock read each). */
#define CLIENT_BLOCK_CHECK_NS (1000ull * 1000)

enum client_block_mode {
    CLIENT_BLOCK_OFF = 0,  /* not in block mode (the service did not ask for it) */
    CLIENT_BLOCK_ON,       /* the ring waits for room */
    CLIENT_BLOCK_PAUSED,   /* a wait ran out: dropping until the reader caught up */
    CLIENT_BLOCK_GIVEN_UP, /* the reader made no progress for CLIENT_BLOCK_GIVE_UP_NS */
};

enum client_block_action {
    CLIENT_BLOCK_NONE = 0,
    CLIENT_BLOCK_RESUME,  /* turn blocking on again */
    CLIENT_BLOCK_GIVE_UP, /* stay dropping for good, and say so */
};

struct client_block {
    _Atomic uint32_t mode; /* enum client_block_mode; read by every sample */
    _Atomic bool busy;     /* a thread runs client_block_step() */
    _Atomic uint64_t next_check_ns;
    uint64_t paused_read_pos; /* the reader's position when the pause began */
    uint64_t last_read_pos;   /* ... when last looked at */
    uint64_t progress_ns;     /* when it last moved (or the pause began) */
};

/* What the ring shows when the step looks. */
struct client_block_view {
    uint64_t now_ns;    /* CLOCK_MONOTONIC(_COARSE) */
    uint64_t read_pos;  /* the reader's position (ring_writer_progress()) */
    uint64_t fill;      /* bytes reserved beyond it */
    uint64_t size;      /* the ring's data area */
    bool ring_blocking; /* ring_is_blocking() */
};

/* Starts in ON when @blocking, else OFF. */
void client_block_init(struct client_block *b, bool blocking);
/* One step of the machine above; returns what the caller must do to the ring. */
enum client_block_action client_block_step(struct client_block *b,
                                           const struct client_block_view *v);

#endif
