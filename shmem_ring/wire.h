/* shmem_ring/wire.h: the bytes that travel between the preload client and the service,
 * through the handshake socket and through the shared ring.
 *
 * Security model. The service trusts nothing the client sends: every field of every
 * struct below may hold any value, the ring's shared header may change between two reads,
 * and records may be truncated, oversized or interleaved with garbage. The service copies
 * a record's fixed part into its own memory once, then validates it (lengths against the
 * record length, stack length against the cap announced in the handshake), and only then
 * uses it. The client, in turn, trusts the service's configuration only after checking
 * the magic and the ring fd's size.
 *
 * Layout rules: fixed-width little-endian fields, explicit padding, sizes and offsets
 * pinned with _Static_assert. New fields are announced by feature bits in the handshake,
 * never by a version number in records.
 *
 * Both halves live here: the client's encoders (inline, hook-safe) and the service's
 * decoders (shmem_ring/wire.c), which check every length the encoders write.
 *
 *     client:  ring_try_begin_write(r, WIRE_ALLOC_PCS, wire_alloc_pcs_len(n), &w);
 *              memcpy(wire_encode_alloc_pcs(w.data, &head, n, 0), pcs, n * 8);
 *     service: wire_decode_alloc_pcs(rd.data, rd.len, &rec, pcs);
 */
#ifndef HP_SHMEM_RING_WIRE_H
#define HP_SHMEM_RING_WIRE_H

#include <stddef.h>
#include <stdint.h>

#include "common/macros.h"
#include "common/regs.h"

/* ---- Handshake ------------------------------------------------------------------- */

#define WIRE_HELLO_MAGIC 0x48505246u  /* "HPRF" */
#define WIRE_CONFIG_MAGIC 0x48504346u /* "HPCF" */

/* Feature bits (wire_hello.features / wire_client_config.features). */
#define WIRE_FEATURE_REGS_X86_64 (1u << 0)
/* Follow forks: in the config, asks the child of fork() to handshake again (reason
 * WIRE_REASON_STARTUP) as a new process with its own ring; without it the child is not
 * profiled unless attached later. */
#define WIRE_FEATURE_FOLLOW_FORK (1u << 1)
/* Unwind table: the config comes with a second fd, the session's unwind table
 * (shmem_ring/utable.h), and the client may send WIRE_ALLOC_PCS records (and audited
 * WIRE_ALLOC records, WIRE_ALLOC_AUDIT), WIRE_MAPS_CHANGED and WIRE_SYNC. */
#define WIRE_FEATURE_UNWIND_TABLE (1u << 2)
/* Python frames: the client tells the CPython runtime it found in the process
 * (WIRE_PY_RUNTIME, once per session) and may end a sampled allocation record with the
 * Python frames its thread was running (WIRE_ALLOC_PY, WIRE_PCS_PY: a struct
 * wire_py_tail after struct wire_py_frame entries). */
#define WIRE_FEATURE_PYFRAMES (1u << 4)
/* Heaps of the program's own (the heapprof_* calls, include/heapprof.h): the config is
 * followed by a struct wire_heaps (the session's selection of heaps), and the client may
 * send WIRE_HEAP_NAME records and samples of heaps other than 0. */
#define WIRE_FEATURE_HEAPS (1u << 3)
/* Titles: the client may send WIRE_TITLE records. */
#define WIRE_FEATURE_TITLE (1u << 5)
/* Frees in batches: the client may send WIRE_FREES records, and sampled allocation records
 * that carry a free of their own address first (WIRE_HEAD_FREE_FIRST). */
#define WIRE_FEATURE_FREE_BATCH (1u << 6)

/* Why the client connects (wire_hello.reason). */
#define WIRE_REASON_STARTUP 1u /* profiling asked for by the environment at startup */
#define WIRE_REASON_ATTACH 2u  /* woken by the attach signal */

/* Client -> service, with SCM_RIGHTS [maps_fd, mem_fd] (/proc/self/maps, /proc/self/mem). */
struct wire_hello {
    uint32_t magic;    /* WIRE_HELLO_MAGIC */
    uint32_t features; /* WIRE_FEATURE_* the client speaks */
    int32_t pid;       /* getpid() of the client; checked against SO_PEERCRED */
    uint32_t reason;   /* WIRE_REASON_* */
};
_Static_assert(sizeof(struct wire_hello) == 16, "wire_hello ABI");

/* A control request instead of a hello, on the same socket (`heapprof dump`): no
 * descriptors; the service answers with the same struct (status 0 or -errno, pid its own)
 * and closes. Only from our own uid or root. */
#define WIRE_CONTROL_MAGIC 0x48504354u /* "HPCT" */
#define WIRE_CONTROL_DUMP 1u           /* dump every profiled process now */
#define WIRE_CONTROL_PING 2u           /* nothing: only the answer */
struct wire_control {
    uint32_t magic; /* WIRE_CONTROL_MAGIC */
    uint32_t op;    /* WIRE_CONTROL_* */
    int32_t pid;    /* the sender's */
    int32_t status; /* in the answer: 0 or -errno */
};
_Static_assert(sizeof(struct wire_control) == sizeof(struct wire_hello), "control as a hello");

/* Client -> service, on the session's socket after the handshake, with SCM_CREDENTIALS
 * (checked by the kernel against the sending thread's ids): the process changed its user
 * or group ids and the client's session thread took the new ones (preload/ids.c), so the
 * credentials are the process's new ones. The service checks them as it checks a new
 * client's SO_PEERCRED and ends the session when its policy refuses the new uid. The
 * client bumps the ring's count (ring_note_ids_changed()) after sending it. */
#define WIRE_IDS_MAGIC 0x48504944u /* "HPID" */
struct wire_ids {
    uint32_t magic; /* WIRE_IDS_MAGIC */
    int32_t pid;    /* getpid() */
    uint32_t uid;   /* effective uid, as in the credentials */
    uint32_t gid;   /* effective gid, as in the credentials */
};
_Static_assert(sizeof(struct wire_ids) == 16, "wire_ids ABI");

/* Client -> service, on the parent's session socket, from a child of fork() the session
 * does not follow (its atfork handler, before it lets go of the parent's connection): the
 * credentials (SCM_CREDENTIALS, which the kernel adds when the service asks for them)
 * name the child, which the service counts as not followed unless it connects itself
 * (after an exec). The parent bumps the ring's count (ring_count_fork_unfollowed()) so
 * that the service reads it soon. Same size as wire_ids: one read per message. */
#define WIRE_FORKED_MAGIC 0x48504643u /* "HPFC" */
struct wire_forked {
    uint32_t magic; /* WIRE_FORKED_MAGIC */
    int32_t pid;    /* getpid() of the child */
    uint32_t unused[2];
};
_Static_assert(sizeof(struct wire_forked) == sizeof(struct wire_ids), "one size of message");

/* wire_client_config.status */
#define WIRE_STATUS_PROFILE 0u      /* ring fd attached; start sampling */
#define WIRE_STATUS_NOT_PROFILED 1u /* no fd; stay passthrough */

/* Service -> client, with SCM_RIGHTS [ring_fd] when status == WIRE_STATUS_PROFILE, and
 * [ring_fd, utable_fd] when the features include WIRE_FEATURE_UNWIND_TABLE. */
struct wire_client_config {
    uint32_t magic;                   /* WIRE_CONFIG_MAGIC */
    uint32_t status;                  /* WIRE_STATUS_* */
    uint32_t features;                /* features the service accepted (subset of the hello's) */
    uint32_t block_client;            /* 1: wait for ring space up to block_client_timeout_us */
    uint64_t sampling_interval_bytes; /* >= 1 */
    uint64_t max_stack_bytes;         /* cap of a stack copy, multiple of 8 */
    uint32_t block_client_timeout_us;
    /* With WIRE_FEATURE_UNWIND_TABLE: every audit_every-th stack a thread walks itself is
     * sent with its copy too (WIRE_ALLOC_AUDIT); 0: never. Else 0. */
    uint32_t audit_every;
};
_Static_assert(sizeof(struct wire_client_config) == 40, "wire_client_config ABI");

/* Longest heap name, with its NUL; heaps a selection names at most. */
#define WIRE_HEAP_NAME_MAX 64
#define WIRE_MAX_HEAP_SELECT 32
/* wire_heaps.flags: every heap is selected (all_heaps), the names do not matter. */
#define WIRE_HEAPS_ALL (1u << 0)
/* The heap malloc and its family report to: always heap id 0. */
#define WIRE_HEAP_MALLOC_NAME "libc.malloc"
/* The heap of CPython's object allocator (PyObject_Malloc & co), recorded by default
 * beside malloc's in a Python process. */
#define WIRE_HEAP_PYTHON_NAME "python.objects"

/* Service -> client, after the wire_client_config when the features include
 * WIRE_FEATURE_HEAPS: the heaps the session records, by name ("libc.malloc" for the
 * malloc family). A heap not selected is not sampled. Names are NUL-terminated within
 * their WIRE_HEAP_NAME_MAX bytes; the client ignores one that is not. */
struct wire_heaps {
    uint32_t flags; /* WIRE_HEAPS_* */
    uint32_t n;     /* names used, <= WIRE_MAX_HEAP_SELECT */
    char names[WIRE_MAX_HEAP_SELECT][WIRE_HEAP_NAME_MAX];
};
_Static_assert(sizeof(struct wire_heaps) == 8 + 32 * 64, "wire_heaps ABI");

/* ---- Ring records ---------------------------------------------------------------- */

/* Record types (the ring's record header carries them). */
enum wire_type {
    WIRE_ALLOC = 1,     /* struct wire_alloc followed by stack_len bytes of stack */
    WIRE_FREE = 2,      /* struct wire_free */
    WIRE_ALLOC_PCS = 3, /* struct wire_alloc_pcs followed by n_pcs uint64_t pcs */
    /* The client's code changed (objects loaded, or unloaded: WIRE_MAPS_UNLOADED), seen on
     * its sampled path before the sample it writes next: struct wire_maps_changed. The
     * service rereads the maps before the next sample, then answers the ask (the client
     * may wait for it, so that the maps are read while the new code is there); with
     * WIRE_MAPS_UNLOADED it also starts a new generation of the unwind table (code may be
     * gone, and other code may come at its addresses). */
    WIRE_MAPS_CHANGED = 4,
    /* No payload. A client may wait until the service has read it (ring_wait_consumed):
     * then every record before it was handled. (Clients no longer send it before a
     * dlclose, which must not wait: the service keeps the mappings it saw go instead,
     * unwinder_retired_seq().) */
    WIRE_SYNC = 5,
    /* struct wire_py_runtime (WIRE_FEATURE_PYFRAMES): what the client found of CPython,
     * before its first record with Python frames. */
    WIRE_PY_RUNTIME = 6,
    /* The name of a heap the program registered (WIRE_FEATURE_HEAPS): struct
     * wire_heap_name. Sent once per heap and session, before or after its first samples;
     * the dumps name the heap by it (else "heap_<id>"). */
    WIRE_HEAP_NAME = 7,
    /* What names a code object (WIRE_FEATURE_PYFRAMES): struct wire_py_code and its
     * bytes, sent by the client the first time a session samples the object, before the
     * sample, so that the service names its frames without reading the process's memory
     * (which may have freed the object, or exited, by the time its records are read). */
    WIRE_PY_CODE = 8,
    /* The process's title as its /proc/PID/cmdline reads (WIRE_FEATURE_TITLE): 1 to
     * WIRE_TITLE_MAX bytes, sent by the client at exit(), its last record. A process that
     * names its role and exits soon after (an nginx worker told to stop, a postgres
     * backend of a short connection) is gone before the service reads its title, and
     * would keep its parent's name. */
    WIRE_TITLE = 9,
    /* Frees of sampled blocks of one heap, in the order given, each recorded after it
     * happened and before any later sampled allocation of its address
     * (WIRE_FEATURE_FREE_BATCH): struct wire_frees and n addresses, of which those that are
     * 0 are left out (recorded elsewhere). */
    WIRE_FREES = 10,
};

#define WIRE_TITLE_MAX 4096

struct wire_heap_name {
    uint32_t heap_id; /* 1.. (0 is always WIRE_HEAP_MALLOC_NAME) */
    uint32_t len;     /* bytes of name used, < WIRE_HEAP_NAME_MAX */
    char name[WIRE_HEAP_NAME_MAX];
};
_Static_assert(sizeof(struct wire_heap_name) == 72, "wire_heap_name ABI");

#define WIRE_MAPS_UNLOADED (1u << 0)
struct wire_maps_changed {
    uint32_t flags; /* WIRE_MAPS_* */
    /* The client waits for the maps to be read for this (ring_wait_maps_read(): the low
     * 32 bits of a ring_ask_maps_read() number); 0: nobody waits. */
    uint32_t ask;
};
_Static_assert(sizeof(struct wire_maps_changed) == 8, "wire_maps_changed ABI");

/* x86_64 registers in DWARF / libunwind (UNW_X86_64_*) numbering:
 * rax rdx rcx rbx rsi rdi rbp rsp r8 r9 r10 r11 r12 r13 r14 r15 rip. The client fills
 * at least rbx, rbp, rsp, r12-r15 and rip; the others may be 0. */
#define WIRE_NREGS 17
_Static_assert(WIRE_NREGS == HP_NREGS, "register layout");
#define WIRE_REG_RBX 3
#define WIRE_REG_RBP 6
#define WIRE_REG_RSP 7
#define WIRE_REG_R12 12
#define WIRE_REG_R13 13
#define WIRE_REG_R14 14
#define WIRE_REG_R15 15
#define WIRE_REG_RIP 16

/* wire_alloc.flags. STACK_TRUNCATED: the copy stops short of the stack's end: it hit the
 * client's cap (max_stack_bytes), or, on a stack not the thread's own, the stack may go on
 * past it. The service does not read the rest from the process (it has changed since)
 * and ends such a stack with a frame of its own (not an unwinding error). */
#define WIRE_ALLOC_STACK_TRUNCATED (1u << 0)
#define WIRE_ALLOC_UNKNOWN_STACK (1u << 1) /* sp outside the thread's known stack */
/* The client also walked this stack with its unwind table: after the stack come a
 * uint64_t count and that many pcs, which the service checks against its own unwind. */
#define WIRE_ALLOC_AUDIT (1u << 2)
/* The record ends with the thread's Python frames (struct wire_py_tail). */
#define WIRE_ALLOC_PY (1u << 3)
/* Most pcs an audit or a WIRE_ALLOC_PCS record carries: as deep as the service unwinds
 * (UNWINDER_MAX_FRAMES), so that deep stacks are walked rather than copied. */
#define WIRE_MAX_PCS 500

/* A sampled allocation. The stack copy starts at address @stack_ptr in the client
 * (== regs[WIRE_REG_RSP] or below it) and is @stack_len bytes long. */
struct wire_alloc {
    uint64_t unused0;     /* 0 (see wire_alloc_head) */
    uint64_t addr;        /* address returned to the app */
    uint64_t size;        /* bytes the app asked for */
    uint64_t sample_size; /* bytes attributed by the sampler (interval * k, or size) */
    uint64_t head_flags;  /* WIRE_HEAD_* (see wire_alloc_head) */
    uint32_t heap_id;     /* 0 = libc.malloc */
    uint32_t tid;
    uint64_t stack_ptr;
    uint32_t stack_len;
    uint32_t flags; /* WIRE_ALLOC_* */
    uint64_t regs[WIRE_NREGS];
};
_Static_assert(sizeof(struct wire_alloc) == 200, "wire_alloc ABI");
_Static_assert(offsetof(struct wire_alloc, stack_ptr) == 48, "wire_alloc ABI");
_Static_assert(offsetof(struct wire_alloc, regs) == 64, "wire_alloc ABI");

/* The fields both kinds of sampled allocation record start with, at the same offsets
 * (struct wire_alloc, struct wire_alloc_pcs). */
struct wire_alloc_head {
    /* 0. Was a sequence number the client took from one counter shared by its threads;
     * the service numbers the records in ring order instead (service/unwind_records.c),
     * which is free for the client and as good: a free is reserved before the real
     * free, an allocation before the hook returns the address. Old clients' values are
     * ignored. */
    uint64_t unused0;
    uint64_t addr;
    uint64_t size;
    uint64_t sample_size;
    /* WIRE_HEAD_*. Was the time of the sample (CLOCK_MONOTONIC_COARSE), which the service
     * never read: old clients' values are ignored unless the session speaks
     * WIRE_FEATURE_FREE_BATCH. */
    uint64_t head_flags;
    uint32_t heap_id;
    uint32_t tid;
};
_Static_assert(sizeof(struct wire_alloc_head) == 48, "wire_alloc_head ABI");
/* wire_alloc_head.head_flags (WIRE_FEATURE_FREE_BATCH): the address was freed before this
 * allocation and that free is not recorded elsewhere: apply it first. */
#define WIRE_HEAD_FREE_FIRST (1u << 0)
_Static_assert(offsetof(struct wire_alloc, tid) == offsetof(struct wire_alloc_head, tid) &&
                   offsetof(struct wire_alloc, stack_ptr) == sizeof(struct wire_alloc_head),
               "wire_alloc starts with a wire_alloc_head");

/* A sampled allocation whose stack the client walked itself (WIRE_FEATURE_UNWIND_TABLE):
 * followed by n_pcs pcs, innermost first: the pc of the allocation's call site (the
 * regs[WIRE_REG_RIP] a WIRE_ALLOC record would carry), then return addresses up to the
 * outermost frame. */
struct wire_alloc_pcs {
    struct wire_alloc_head head;
    uint32_t n_pcs; /* 1..WIRE_MAX_PCS */
    uint32_t flags; /* WIRE_PCS_* */
};
_Static_assert(sizeof(struct wire_alloc_pcs) == 56, "wire_alloc_pcs ABI");
/* wire_alloc_pcs.flags. PARTIAL: the walk stopped before the outermost frame (the unwind
 * table changed while the client was walking a stack deeper than it keeps pcs of on its
 * own stack): the stack goes on past the last pc. The record may be longer than its pcs. */
#define WIRE_PCS_PARTIAL (1u << 0)
/* The record ends with the thread's Python frames (struct wire_py_tail). */
#define WIRE_PCS_PY (1u << 1)
_Static_assert(offsetof(struct wire_alloc_pcs, n_pcs) == 48, "wire_alloc_pcs ABI");

/* A free of an address the client sampled (or of any address once the client's filter
 * overflowed). Recorded before the real free. */
struct wire_free {
    uint64_t unused0; /* 0 (see wire_alloc_head) */
    uint64_t addr;
    uint32_t heap_id;
    uint32_t reserved;
};
_Static_assert(sizeof(struct wire_free) == 24, "wire_free ABI");

/* Frees in a batch (WIRE_FREES): followed by n uint64_t addresses. */
struct wire_frees {
    uint32_t n; /* 1..WIRE_MAX_FREES */
    uint32_t heap_id;
};
_Static_assert(sizeof(struct wire_frees) == 8, "wire_frees ABI");
#define WIRE_MAX_FREES 64

/* Bytes of a WIRE_FREES payload of @n addresses. */
static inline size_t wire_frees_len(size_t n)
{
    return sizeof(struct wire_frees) + n * sizeof(uint64_t);
}

/* ---- Python frames (WIRE_FEATURE_PYFRAMES) ------------------------------------------ */

/* wire_py_runtime.status */
#define WIRE_PY_OK 0u          /* frames follow in records */
#define WIRE_PY_VERSION 1u     /* a CPython whose frames the client cannot read */
#define WIRE_PY_DEBUG_BUILD 2u /* a debug build (another object layout) */
#define WIRE_PY_LAYOUT 3u      /* the interpreter's types do not have the expected sizes */

/* Told once per session, before the first record with Python frames, or alone when the
 * runtime is not supported. Untrusted like all else: the service only reads memory of the
 * client with it. */
struct wire_py_runtime {
    uint32_t hexversion; /* Py_Version (PY_VERSION_HEX) */
    uint32_t status;     /* WIRE_PY_* */
    uint64_t code_type;  /* address of PyCode_Type (WIRE_PY_OK), else 0 */
};
_Static_assert(sizeof(struct wire_py_runtime) == 16, "wire_py_runtime ABI");

/* One Python frame the thread was running: its code object and the instruction it ran
 * (code units from the start of the code's bytecode; -1 before the first). The code
 * object may be freed, and its address reused by another, before the service reads it:
 * the flags' upper bits carry wire_py_check() of the object as the client saw it, which
 * the service compares with what it reads (or with the name it kept for the address). */
#define WIRE_PYF_ENTRY (1u << 0) /* the first frame of one run of the evaluation loop */
#define WIRE_PYF_CHECK_SHIFT 8
struct wire_py_frame {
    uint64_t code;
    int32_t instr;
    uint32_t flags; /* WIRE_PYF_*, check << WIRE_PYF_CHECK_SHIFT */
};

/* 24 bits that tell code objects apart: from the addresses of its file and qualified name
 * and its first line. */
static inline uint32_t wire_py_check(uint64_t filename, uint64_t qualname, int32_t firstlineno)
{
    uint64_t x = filename * 0x9e3779b97f4a7c15ull ^ qualname;
    x = (x ^ (x >> 31)) * 0xbf58476d1ce4e5b9ull ^ (uint32_t)firstlineno;
    x = (x ^ (x >> 29)) * 0x94d049bb133111ebull;
    return (uint32_t)(x >> 40);
}
_Static_assert(sizeof(struct wire_py_frame) == 16, "wire_py_frame ABI");

/* WIRE_PY_CODE: what names the code object at @code whose wire_py_check() is @check,
 * read by the client while its thread ran the object (under the GIL). Followed by
 * qualname_len bytes of its qualified name, filename_len bytes of its file (both ASCII,
 * as CPython keeps them in compact ASCII strings) and linetable_len bytes of its
 * location table (co_linetable); the payload is exactly that long. code 0: nothing (a
 * read that failed after the room was taken). Untrusted like all else. */
#define WIRE_PY_NAME_MAX 256u
#define WIRE_PY_PATH_MAX 1024u
#define WIRE_PY_LINETABLE_MAX 2048u
struct wire_py_code {
    uint64_t code;
    uint32_t check; /* 24 bits */
    int32_t firstlineno;
    uint32_t qualname_len;  /* 1..WIRE_PY_NAME_MAX */
    uint32_t filename_len;  /* 1..WIRE_PY_PATH_MAX */
    uint32_t linetable_len; /* 0..WIRE_PY_LINETABLE_MAX */
    uint32_t reserved;      /* 0 */
};
_Static_assert(sizeof(struct wire_py_code) == 32, "wire_py_code ABI");

/* The last bytes of a record with WIRE_ALLOC_PY / WIRE_PCS_PY: n_frames struct
 * wire_py_frame come right before it, innermost first. */
#define WIRE_PYT_TRUNCATED (1u << 0) /* more frames than sent: the outermost are missing */
#define WIRE_PYT_BROKEN (1u << 1)    /* a frame could not be read: the walk stopped there */
struct wire_py_tail {
    uint32_t n_frames; /* 0..WIRE_MAX_PY_FRAMES */
    uint32_t flags;    /* WIRE_PYT_* */
};
_Static_assert(sizeof(struct wire_py_tail) == 8, "wire_py_tail ABI");
#define WIRE_MAX_PY_FRAMES 64

/* Bytes the Python frames add to a record: @n frames and the tail. */
static inline size_t wire_py_len(size_t n)
{
    return n * sizeof(struct wire_py_frame) + sizeof(struct wire_py_tail);
}

/* Writes @n @frames and their tail so that they end at @end (one past the record). */
static inline void wire_encode_py(uint8_t *end, const struct wire_py_frame *frames, size_t n,
                                  uint32_t flags)
{
    struct wire_py_tail t = {.n_frames = (uint32_t)n, .flags = flags};
    __builtin_memcpy(end - sizeof(t), &t, sizeof(t));
    __builtin_memcpy(end - wire_py_len(n), frames, n * sizeof(*frames));
}

/* ---- Encoders (client side; hook-safe: no calls but memcpy) ------------------------ */

/* Payload bytes of a WIRE_ALLOC_PCS record with @n_pcs pcs. */
static inline size_t wire_alloc_pcs_len(size_t n_pcs)
{
    return sizeof(struct wire_alloc_pcs) + n_pcs * sizeof(uint64_t);
}

/* Payload bytes of a WIRE_ALLOC record with @stack_len bytes of stack and, when
 * @n_audit_pcs > 0 (WIRE_ALLOC_AUDIT), the client's own walk of it. */
static inline size_t wire_alloc_len(size_t stack_len, size_t n_audit_pcs)
{
    return sizeof(struct wire_alloc) + stack_len +
           (n_audit_pcs ? (1 + n_audit_pcs) * sizeof(uint64_t) : 0);
}

/* Writes the fixed part of a WIRE_ALLOC_PCS payload with @n_pcs pcs and @flags
 * (WIRE_PCS_*) at @dst; returns where the @n_pcs pcs go. */
static inline uint64_t *wire_encode_alloc_pcs(void *dst, const struct wire_alloc_head *h,
                                              size_t n_pcs, uint32_t flags)
{
    struct wire_alloc_pcs a = {.head = *h, .n_pcs = (uint32_t)n_pcs, .flags = flags};
    __builtin_memcpy(dst, &a, sizeof(a));
    return (uint64_t *)((uint8_t *)dst + sizeof(a));
}

/* Writes the fixed part of a WIRE_ALLOC payload at @dst and, when @n_audit_pcs > 0
 * (flags then include WIRE_ALLOC_AUDIT), the count of the client's own walk after the
 * @stack_len bytes of stack. Returns where the stack goes; the walk's pcs go at
 * wire_alloc_audit_pcs(). */
static inline void *wire_encode_alloc(void *dst, const struct wire_alloc_head *h,
                                      uint64_t stack_ptr, size_t stack_len, uint32_t flags,
                                      const uint64_t regs[WIRE_NREGS], size_t n_audit_pcs)
{
    struct wire_alloc *a = dst;
    __builtin_memcpy(a, h, sizeof(*h));
    a->stack_ptr = stack_ptr;
    a->stack_len = (uint32_t)stack_len;
    a->flags = flags | (n_audit_pcs ? WIRE_ALLOC_AUDIT : 0);
    __builtin_memcpy(a->regs, regs, sizeof(a->regs));
    if (n_audit_pcs) {
        uint64_t count = n_audit_pcs;
        __builtin_memcpy((uint8_t *)(a + 1) + stack_len, &count, sizeof(count));
    }
    return a + 1;
}

/* Where the audit pcs of a WIRE_ALLOC payload go, given its stack (from
 * wire_encode_alloc()) and @stack_len. */
static inline uint64_t *wire_alloc_audit_pcs(void *stack, size_t stack_len)
{
    return (uint64_t *)((uint8_t *)stack + stack_len + sizeof(uint64_t));
}

/* Writes a WIRE_FREE payload at @dst. */
static inline void wire_encode_free(void *dst, uint64_t addr, uint32_t heap_id)
{
    struct wire_free f = {.unused0 = 0, .addr = addr, .heap_id = heap_id, .reserved = 0};
    __builtin_memcpy(dst, &f, sizeof(f));
}

/* Writes the head of a WIRE_FREES payload of @n addresses at @dst; returns where they go. */
static inline uint64_t *wire_encode_frees(void *dst, uint32_t n, uint32_t heap_id)
{
    struct wire_frees f = {.n = n, .heap_id = heap_id};
    __builtin_memcpy(dst, &f, sizeof(f));
    return (uint64_t *)((uint8_t *)dst + sizeof(f));
}

/* Writes a WIRE_HEAP_NAME payload at @dst: @len bytes of @name (pre: len <
 * WIRE_HEAP_NAME_MAX), the rest zero. */
static inline void wire_encode_heap_name(void *dst, uint32_t heap_id, const char *name, size_t len)
{
    struct wire_heap_name h = {.heap_id = heap_id, .len = (uint32_t)len};
    __builtin_memcpy(h.name, name, len);
    __builtin_memcpy(dst, &h, sizeof(h));
}

/* Writes a WIRE_MAPS_CHANGED payload at @dst. */
static inline void wire_encode_maps_changed(void *dst, uint32_t flags, uint32_t ask)
{
    struct wire_maps_changed m = {.flags = flags, .ask = ask};
    __builtin_memcpy(dst, &m, sizeof(m));
}

/* ---- Decoders (service side; every byte untrusted) -------------------------------- */

/* Copies the fixed part of a WIRE_ALLOC payload (@data, @len bytes, possibly shared
 * memory) into @ret and validates it: the stack (returned in @ret_stack, borrowed from
 * @data, ret->stack_len bytes) must fit the payload and @max_stack_bytes. With WIRE_ALLOC_AUDIT,
 * the client's pcs that follow the stack are copied to @ret_pcs (room for WIRE_MAX_PCS) and counted
 * in @ret_n_pcs (else 0). Returns 0 or -EBADMSG. */
int wire_decode_alloc(const uint8_t *data, size_t len, uint64_t max_stack_bytes,
                      struct wire_alloc *ret, const uint8_t **ret_stack, uint64_t *ret_pcs,
                      size_t *ret_n_pcs) HP_WARN_UNUSED;
/* Copies a WIRE_ALLOC_PCS payload: the fixed part into @ret, its 1..WIRE_MAX_PCS pcs into
 * @ret_pcs (room for WIRE_MAX_PCS). Returns 0 or -EBADMSG. */
int wire_decode_alloc_pcs(const uint8_t *data, size_t len, struct wire_alloc_pcs *ret,
                          uint64_t *ret_pcs) HP_WARN_UNUSED;
/* Splits the Python frames off the end of a record of @len bytes at @data (one whose
 * flags say it has them): copies them to @ret_frames (room for WIRE_MAX_PY_FRAMES),
 * their tail to @ret_tail, and sets @ret_len to the length of the record without them.
 * Returns 0 or -EBADMSG. */
int wire_decode_py(const uint8_t *data, size_t len, struct wire_py_tail *ret_tail,
                   struct wire_py_frame *ret_frames, size_t *ret_len) HP_WARN_UNUSED;
/* Copies a WIRE_PY_RUNTIME payload into @ret. Returns 0 or -EBADMSG when too short. */
int wire_decode_py_runtime(const uint8_t *data, size_t len,
                           struct wire_py_runtime *ret) HP_WARN_UNUSED;
/* Copies the fixed part of a WIRE_PY_CODE payload into @ret and checks it (lengths in
 * bounds and adding up to @len, a check of 24 bits, printable ASCII names); the name,
 * file and table are returned borrowed from @data. Returns 0 or -EBADMSG. */
int wire_decode_py_code(const uint8_t *data, size_t len, struct wire_py_code *ret,
                        const char **ret_qualname, const char **ret_filename,
                        const uint8_t **ret_linetable) HP_WARN_UNUSED;
/* Copies a WIRE_FREE payload into @ret. Returns 0 or -EBADMSG when too short. */
int wire_decode_free(const uint8_t *data, size_t len, struct wire_free *ret) HP_WARN_UNUSED;
/* Copies the head of a WIRE_FREES payload into @ret and its 1..WIRE_MAX_FREES addresses
 * into @ret_addrs (room for WIRE_MAX_FREES). Returns 0 or -EBADMSG. */
int wire_decode_frees(const uint8_t *data, size_t len, struct wire_frees *ret,
                      uint64_t *ret_addrs) HP_WARN_UNUSED;
/* Copies a WIRE_HEAP_NAME payload into @ret and checks it: a heap id above 0, a name of
 * 1..WIRE_HEAP_NAME_MAX - 1 bytes, NUL-terminated in @ret. Returns 0 or -EBADMSG. */
int wire_decode_heap_name(const uint8_t *data, size_t len,
                          struct wire_heap_name *ret) HP_WARN_UNUSED;
/* Copies a WIRE_MAPS_CHANGED payload into @ret. Returns 0 or -EBADMSG when too short. */
int wire_decode_maps_changed(const uint8_t *data, size_t len,
                             struct wire_maps_changed *ret) HP_WARN_UNUSED;

#endif
