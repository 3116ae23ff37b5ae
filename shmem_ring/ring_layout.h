/* shmem_ring/ring_layout.h: internal layout of the shared ring (both sides).
 *
 * The memfd holds one 4 KiB header page followed by the data area (N bytes, a power of
 * two), cut into K lanes (below). Each process reserves 4096 + 4096 + 2N bytes of address
 * space and maps, in order: a private page holding its own `struct ring` (so mapping a
 * ring never calls malloc), the shared header page, then each lane twice in a row, so
 * that a record starting near the end of its lane is contiguous in memory (K = 1):
 *
 *     base                base+4K            base+8K          base+8K+N       base+8K+2N
 *     | struct ring (priv) | ring_shared (hdr) | data [0, N)     | data [0, N) again |
 *
 * Fork: the private page is MADV_WIPEONFORK and the rest MADV_DONTFORK, so in a child
 * the struct ring reads as zeros (hdr == NULL: every writer call refuses with -EPIPE)
 * and the shared pages are not mapped at all: a child can never write into the ring.
 *
 * Lanes. The data area is cut into K lanes of N / K bytes (K a power of two, 1 to
 * RING_MAX_LANES, in the header), each a ring of its own: its own write and read
 * positions on lines of their own (lane 0's in the header's first lines, the others' in
 * lane_ctl), its own two mappings. A writer reserves in the lane of the CPU it runs on
 * (rdtscp), so threads recording at once do not take each other's lines; threads of one
 * CPU share a lane, which they rarely use at the same moment. K is 1 unless the service
 * asks for more (ring_create_lanes()).
 *
 * Order. Every record carries a stamp, fixed when it is reserved: the lane's write
 * position and its last stamp are one 16-byte word, moved by one compare-and-swap to
 * (position + size, max(TSC, last stamp + 1)). So stamps grow along a lane, whoever
 * writes there (threads of one CPU, a signal handler inside a hook), and a record
 * reserved after another in real time has a larger stamp. The reader merges the lanes by
 * stamp: it hands out the published head with the smallest stamp once no other lane can
 * still hold a smaller one: a lane whose head is reserved but unpublished holds stamps
 * above the last one read there; an empty lane, stamps above its horizon, which the
 * reader sets by moving the lane's last stamp up to the TSC with the same
 * compare-and-swap (a writer reserving at that moment fails and retries above it). The
 * client records a free before the real free and an allocation after the real
 * allocation returned, so a free and a reuse of the same address, in any two threads,
 * are read in the order they happened. With one lane the stamp only counts.
 *
 * Positions are 64-bit byte counters that only grow; a record at position p of a lane
 * starts at its data + (p & (N / K - 1)). Records are 8-byte aligned and start with a
 * ring_rec header. A
 * record is published when its commit tag equals its position XOR RING_TAG_MAGIC: a tag
 * left over from an earlier lap (a different position) never matches. Until then the tag
 * names the thread writing the record (RING_TAG_RESERVED | tid): a reader that finds a
 * record unpublished for long can ask whether that thread is stopped (a debugger, SIGSTOP)
 * or gone, instead of guessing (ring_stalled_writer()).
 *
 * Waking the reader needs no descriptor: reader_idle is a futex word. A writer that finds
 * the reader asleep sets it awake and calls FUTEX_WAKE on it; the futex is keyed by the
 * memfd's page, so it works across processes (the reader waits with FUTEX_WAIT or
 * futex_waitv on its own mapping of the same page).
 *
 * Every field below the magic is written by untrusted parties from the reader's point of
 * view: the reader copies what it needs into locals once and validates it.
 */
#ifndef HP_SHMEM_RING_RING_LAYOUT_H
#define HP_SHMEM_RING_RING_LAYOUT_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "shmem_ring/ring.h"

#define RING_HEADER_SIZE 4096u
#define RING_PRIVATE_SIZE 4096u
#define RING_CACHE_LINE 64u
#define RING_MAX_LANES 8u
/* Where lane_ctl starts in the header page. */
#define RING_LANE_CTL_OFFSET 1024u
#define RING_HEADER_MAGIC 0x4850524e47303031ull /* "HPRNG001" */
#define RING_TAG_MAGIC 0x9e3779b97f4a7c15ull
/* Writers give up a reservation after this many lost compare-and-swap races. */
#define RING_MAX_CAS_RETRIES 64
/* A reserved record's commit tag until it is published: the high half, with the writer's
 * thread id in the low half. pos ^ RING_TAG_MAGIC has this high half only at positions
 * beyond 2^63, which a ring never reaches. */
#define RING_TAG_RESERVED (0x52535644ull << 32) /* "RSVD" */
#define RING_TAG_RESERVED_MASK (0xffffffffull << 32)
/* shared reader_idle values */
#define RING_READER_AWAKE 0u
#define RING_READER_SLEEPING 1u
#define RING_READER_POLLING 2u
/* ring_rec.flags: the low bits hold the padding added to reach 8-byte alignment. */
#define RING_REC_PAD_MASK 0x7u

struct ring_rec {
    _Atomic uint64_t commit_tag; /* pos ^ RING_TAG_MAGIC once published */
    uint32_t len_total;          /* header + payload + padding; multiple of 8 */
    uint16_t type;               /* enum wire_type */
    uint16_t flags;              /* RING_REC_PAD_MASK: padding bytes after the payload */
    uint64_t stamp;              /* the order among lanes (see above) */
};
_Static_assert(sizeof(struct ring_rec) == 24, "ring_rec ABI");

/* The positions of lanes 1..K-1. write_pos and last_stamp form the 16-byte word of a
 * reservation; read_pos is the reader's, on a line of its own. */
struct ring_lane_shared {
    _Alignas(RING_CACHE_LINE) _Atomic uint64_t write_pos;
    _Atomic uint64_t last_stamp;
    _Alignas(RING_CACHE_LINE) _Atomic uint64_t read_pos;
};

/* The shared header page. Hot fields sit on their own cache line so writers bumping
 * write_pos do not slow down the reader's read_pos updates and vice versa. */
struct ring_shared {
    _Alignas(RING_CACHE_LINE) uint64_t magic; /* RING_HEADER_MAGIC, written by ring_create */
    uint64_t data_size;                       /* N */
    /* Set by the reader (ring_set_detached()) when the session ends; writers then stop.
     * Shares the read-mostly first line so the writers' check costs no extra cache miss. */
    _Atomic uint32_t detached;
    /* Set by the client when it ends the session itself (enum ring_end_reason), before it
     * wakes the reader; written once, read by the reader as an untrusted hint. */
    _Atomic uint32_t client_ended;
    /* Set by the client when its process starts exiting normally (exit(), a return from
     * main): the end of the connection that follows is no loss. An untrusted hint. */
    _Atomic uint32_t client_exiting;
    /* K, written by ring_create_lanes(); 0 reads as 1 (rings of ring_create()). */
    uint32_t lanes;
    /* Lane 0's positions (the only lane of most rings). */
    _Alignas(RING_CACHE_LINE) _Atomic uint64_t write_pos;
    _Atomic uint64_t last_stamp;
    _Alignas(RING_CACHE_LINE) _Atomic uint64_t read_pos;
    /* Written by the reader only (read-mostly for the writers): RING_READER_* and, while
     * it is RING_READER_POLLING, the fill at which a writer pokes anyway. */
    _Alignas(RING_CACHE_LINE) _Atomic uint32_t reader_idle;
    _Atomic uint64_t wake_fill;
    /* Written by the writers with relaxed atomics, on their rare paths only (a shared
     * counter bumped on every record costs the app more than the record itself).
     * records_dropped counts records refused because the ring was full (after the
     * block_client wait, if any) or the record too big; reserve_failures counts records
     * given up after RING_MAX_CAS_RETRIES lost races (not included in records_dropped). */
    _Alignas(RING_CACHE_LINE) struct {
        /* The program's call slots of the allocator the client could not switch to its
         * hooks for this session (preload/direct.h): their calls are not seen. Set once,
         * before the first record. */
        _Atomic uint64_t unseen_slots;
        /* Samples dropped because the client's set of watched addresses was full (also
         * counted in records_dropped): a full set, not a full ring. */
        _Atomic uint64_t freeset_full;
        _Atomic uint64_t records_dropped;
        _Atomic uint64_t reserve_failures;
        _Atomic uint64_t client_spinlock_blocked_us;
        _Atomic uint64_t max_fill_bytes;
        /* Frees of sampled blocks the client could not record (ring full, or a free
         * from a signal handler that interrupted a hook and found no room): each is a
         * phantom leak in the profile. Also counted in records_dropped when the ring
         * refused the record. */
        _Atomic uint64_t frees_lost;
        /* Block waits that ran out (the reader made no room within the timeout); each
         * ends blocking until the client turns it on again (ring_try_begin_write()). */
        _Atomic uint64_t block_timeouts;
    } stats;
    /* Reads of the writers' maps asked for in records (ring_ask_maps_read()): the writers
     * count the asks, the reader stores the last one it answered. */
    _Alignas(RING_CACHE_LINE) _Atomic uint64_t maps_asked;
    _Atomic uint64_t maps_read;
    /* Written by the writers, rarely: times blocking was turned on again after a block
     * timeout (the reader had caught up), and 1 once the client gave up waiting for good
     * (the reader made no progress for CLIENT_BLOCK_GIVE_UP_NS; preload/blockstate.h). */
    _Alignas(RING_CACHE_LINE) _Atomic uint64_t block_resumes;
    _Atomic uint64_t block_given_up;
    /* Written by the client's session thread: how often the process changed its user or
     * group ids and the thread took the new ones, each time after it told the service the
     * new ids on the socket (ring_note_ids_changed()). The reader checks them when the
     * count moves. */
    _Alignas(RING_CACHE_LINE) _Atomic uint32_t ids_changes;
    /* Written by the client: children of fork() it did not follow (the session does not
     * follow forks), for the service's "not followed" count. */
    _Atomic uint64_t forks_unfollowed;
    /* Frees the client holds in batches (WIRE_FEATURE_FREE_BATCH): before a dump the
     * reader counts an ask in flush_asked, which the client's session thread looks at
     * every STHREAD_ASK_MS; the thread records every batch, then stores the ask it
     * answered in flush_done (release: those records are reserved before). Untrusted. */
    _Alignas(RING_CACHE_LINE) _Atomic uint32_t flush_asked;
    _Atomic uint32_t flush_done;
    _Alignas(RING_LANE_CTL_OFFSET) struct ring_lane_shared lane_ctl[RING_MAX_LANES - 1];
};
_Static_assert(sizeof(struct ring_shared) <= RING_HEADER_SIZE, "ring header fits a page");
_Static_assert(offsetof(struct ring_shared, detached) == 16, "ring_shared layout");
_Static_assert(offsetof(struct ring_shared, client_ended) == 20, "ring_shared layout");
_Static_assert(offsetof(struct ring_shared, client_exiting) == 24, "ring_shared layout");
_Static_assert(offsetof(struct ring_shared, lanes) == 28, "ring_shared layout");
_Static_assert(offsetof(struct ring_shared, write_pos) == 64, "ring_shared layout");
_Static_assert(offsetof(struct ring_shared, last_stamp) == 72, "ring_shared layout");
_Static_assert(offsetof(struct ring_shared, lane_ctl) == RING_LANE_CTL_OFFSET,
               "ring_shared layout");
_Static_assert(offsetof(struct ring_shared, read_pos) == 128, "ring_shared layout");
_Static_assert(offsetof(struct ring_shared, reader_idle) == 192, "ring_shared layout");
_Static_assert(offsetof(struct ring_shared, stats) == 256, "ring_shared layout");
_Static_assert(offsetof(struct ring_shared, maps_asked) == 320, "ring_shared layout");
_Static_assert(offsetof(struct ring_shared, block_resumes) == 384, "ring_shared layout");
_Static_assert(offsetof(struct ring_shared, ids_changes) == 448, "ring_shared layout");

/* One lane, as this process sees it. */
struct ring_lane {
    _Atomic uint64_t *word; /* its write_pos and last_stamp: 16 bytes, 16-aligned */
    _Atomic uint64_t *shared_read_pos;
    uint8_t *data; /* first copy of the lane's bytes; data + lane size is the second */
    /* Reader: its own read position (the shared copy is only written, never trusted),
     * write_pos as last loaded (records below it are reserved), and read_pos as last
     * published to the writers (published in steps, see ring_end_read()). */
    uint64_t read_pos;
    uint64_t seen_write_pos;
    uint64_t published_read_pos;
    /* Reader: the stamp of the last record read here (the next one's is larger), and
     * while the lane is empty a stamp below every record reserved there later. */
    uint64_t last_stamp;
    uint64_t horizon;
    /* Reader, with several lanes: the published record at read_pos, when head_ready
     * (published records do not change until read: the merge looks at each once). */
    bool head_ready;
    struct ring_rspan head;
};

/* Per-process view of a ring; lives in the private page in front of the mappings. */
struct ring {
    struct ring_shared *hdr;
    uint64_t size;      /* N: every lane's bytes */
    uint64_t lane_size; /* N / K */
    uint64_t mask;      /* N / K - 1 */
    uint32_t lanes;     /* K */
    bool cas16;         /* the CPU has cmpxchg16b (always, with several lanes) */
    void *map_base;
    size_t map_len;
    enum ring_role role;
    /* Writer: unique per mapping in this process (never reused, also not by a forked
     * child's rings), so that a thread's cached id (ring_writer.c) is known to be fresh. */
    uint64_t map_id;
    /* Writer: with several lanes and no rdpid, the lane the next thread takes. */
    _Atomic uint32_t next_lane;
    /* Writer: block mode; ended by a wait that runs out, turned on again by the client
     * (ring_set_blocking()). */
    _Atomic bool blocking;
    _Atomic uint32_t block_timeout_us;
    /* Reader: records and bytes (whole records) consumed. */
    uint64_t records_read;
    uint64_t bytes_read;
    /* Reader: the unpublished record the reader is waiting for (in lane stall_lane at
     * stall_pos, valid when stall_since_ns != 0) and how long it waits before calling the
     * ring corrupt. */
    uint32_t stall_lane;
    uint64_t stall_pos;
    uint64_t stall_since_ns;
    uint64_t stall_timeout_ns;
    /* Reader: records of writers gone mid-record, skipped (ring_skip_stalled()); the value
     * reader_idle had when the reader last set it (what a waiter waits on). */
    uint64_t records_skipped;
    uint32_t idle_word;
    /* Reader: every record stamped below this has been handed out (ring_reached()). */
    uint64_t frontier;
    struct ring_lane lane[RING_MAX_LANES];
};
_Static_assert(sizeof(struct ring) <= RING_PRIVATE_SIZE, "ring fits its private page");

/* The record at @pos of lane @lane. */
static inline struct ring_rec *ring__rec(const struct ring *r, unsigned lane, uint64_t pos)
{
    return (struct ring_rec *)(r->lane[lane].data + (pos & r->mask));
}

/* The time stamp counter. */
static inline uint64_t ring__tsc(void)
{
    uint32_t lo, hi;
    __asm__ volatile("rdtsc" : "=a"(lo), "=d"(hi));
    return ((uint64_t)hi << 32) | lo;
}

/* After every earlier instruction completed: a stamp later than anything the caller
 * saw happen (an allocation returned). */
static inline uint64_t ring__tsc_ordered(void)
{
    uint32_t lo, hi;
    __asm__ volatile("lfence; rdtsc" : "=a"(lo), "=d"(hi) : : "memory");
    return ((uint64_t)hi << 32) | lo;
}

/* The CPU we run on (rdpid: Linux keeps its number in the low 12 bits of TSC_AUX). */
static inline uint32_t ring__cpu(void)
{
    uint64_t aux;
    __asm__ volatile("rdpid %0" : "=r"(aux));
    return (uint32_t)aux & 0xfffu;
}

/* Compare-and-swap of the 16-byte word @w ({position, stamp}): on failure @expected gets
 * what is there. Not through libatomic, which may take a lock. */
static inline bool ring__cas16(_Atomic uint64_t *w, uint64_t expected[2], const uint64_t desired[2])
{
    bool ok;
    __asm__ volatile("lock cmpxchg16b %1"
                     : "=@ccz"(ok), "+m"(*(volatile uint64_t(*)[2])w), "+a"(expected[0]),
                       "+d"(expected[1])
                     : "b"(desired[0]), "c"(desired[1])
                     : "memory");
    return ok;
}

static inline uint64_t ring__record_total(size_t payload_len)
{
    return ((uint64_t)payload_len + sizeof(struct ring_rec) + 7u) & ~(uint64_t)7u;
}

/* Whether the CPU has cmpxchg16b, which rings of several lanes need. */
bool ring__has_cas16(void);
/* Whether the kernel keeps time with the TSC: it then checked that the CPUs' counters
 * agree, which the order of records across lanes rests on (ring_lanes_for()). */
bool ring__tsc_is_clock(void);

/* Tests: every record the calling thread reserves from now on goes to lane @lane (modulo
 * the ring's lanes), not to its CPU's; -1 undoes it. */
void ring__set_writer_lane(int lane);

/* Creates a memfd of @len bytes named @name, lets @init(header, @arg) fill its first
 * @hdr_len bytes, and seals its size (rings and unwind tables). Returns 0 with the fd in
 * @ret_fd, or -errno. */
int ring__memfd_new(const char *name, size_t len, size_t hdr_len,
                    void (*init)(void *hdr, void *arg), void *arg, int *ret_fd) HP_WARN_UNUSED;

/* True when @fd carries every seal ring__memfd_new() puts on: its size cannot change, nor
 * its seals. Both sides require it before they map a ring or a table (either role): the
 * peer that sent the file could otherwise shrink it and make every access past the new
 * end SIGBUS, inside the program's malloc on the client's side. A real service's files
 * always pass, so a file that does not comes from someone else. Raw system call. */
bool ring__sealed(int fd);

#endif
