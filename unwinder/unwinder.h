/* unwinder/unwinder.h: unwinding of stack copies taken in another process, and
 * symbolization of the frames found.
 *
 * Per-process state (maps, libunwind address space and caches) lives in an
 * unwinder_process_t owned by the unwinder thread serving that process. ELF files,
 * unwind tables, symbol tables, mappings and function names are cached once in the
 * global state shared by all processes (thread-safe); the hp_mapping and string pointers
 * handed out in frames are immutable and valid until unwinder_global_done().
 *
 *     unwinder_global_init();
 *     unwinder_process_t *p;
 *     unwinder_process_new(pid, maps_fd, mem_fd, &p);       // takes both fds
 *     size_t n;
 *     unwinder_unwind(p, rec.regs, rec.stack_ptr, stack, rec.stack_len, frames, 500, &n, &res);
 *     p = unwinder_process_free(p);
 *     unwinder_global_done();
 */
#ifndef HP_UNWINDER_UNWINDER_H
#define HP_UNWINDER_UNWINDER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "common/frame.h"
#include "common/macros.h"
#include "shmem_ring/wire.h"

#define UNWINDER_MAX_FRAMES 500

typedef struct unwinder_process unwinder_process_t;

/* Outcome of one unwind, for ProcessStats. */
struct unwinder_result {
    bool error;         /* the last frame is an "ERROR <reason>" frame */
    bool reparsed_maps; /* an unknown pc made us reread /proc/PID/maps */
    bool truncated;     /* stopped at max_frames */
    /* The stack goes on past what the record holds (a copy cut short, a walk that
     * stopped): the last frame is "ERROR STACK_TRUNCATED". Not an unwinding error: the
     * frames before it are right, the rest was never sent. */
    bool copy_truncated;
};

/* The frame that ends a stack whose record does not hold all of it. */
#define UNWINDER_TRUNCATED_FRAME "ERROR STACK_TRUNCATED"

/* Thread-safe; call once before any other call, and unwinder_global_done() after the
 * last process is freed. */
int unwinder_global_init(void) HP_WARN_UNUSED;
void unwinder_global_done(void);

/* Creates the state for process @pid. Takes ownership of @maps_fd (an open
 * /proc/PID/maps, read from offset 0 with pread) and @mem_fd (/proc/PID/mem) in all
 * cases. Not thread-safe per process: one thread uses a process at a time. */
int unwinder_process_new(pid_t pid, int maps_fd, int mem_fd,
                         unwinder_process_t **ret) HP_WARN_UNUSED;
unwinder_process_t *unwinder_process_free(unwinder_process_t *p);
/* Loads what unwinding and naming the code of @p will need (the ELF cache entries of its
 * executable file mappings of at least @min_code_bytes: unwind tables, symbols), in the
 * order of its maps, starting no file once @budget_ns has passed. Done before a client
 * gets its ring, so that a big binary (node's 90 MB) is read before records wait for it;
 * smaller files are read when a stack first needs them, while the program runs on.
 * Returns the files ready. */
size_t unwinder_process_warm(unwinder_process_t *p, uint64_t min_code_bytes, uint64_t budget_ns);

/* Unwinds one stack copy. @regs: the registers captured by the client (WIRE_REG_*
 * numbering); @stack: the copy of the client's memory at [stack_ptr, stack_ptr+stack_len).
 * Writes up to @max_frames frames, leaf first, to @frames and their count to @ret_n.
 * Leading frames inside libheapprof.so are skipped, so frame 0 is the app's caller of
 * malloc (or operator new, etc.). On failure the frames found so far are kept and one
 * frame with function_name "ERROR <reason>" is appended (counted in the result). Returns
 * 0; -errno only for programmer errors. Never crashes or hangs on hostile input. */
int unwinder_unwind(unwinder_process_t *p, const uint64_t regs[WIRE_NREGS], uint64_t stack_ptr,
                    const uint8_t *stack, size_t stack_len, struct hp_frame *frames,
                    size_t max_frames, size_t *ret_n,
                    struct unwinder_result *ret_res) HP_WARN_UNUSED;

/* What a stack copy holds, and so what the unwind of it may read outside it. */
enum unwinder_copy {
    /* The thread's own stack up to its top (WIRE_ALLOC without flags): outside the copy
     * the process's memory is read as it is now. */
    UNWINDER_COPY_THREAD,
    /* The stack goes on past the copy (WIRE_ALLOC_STACK_TRUNCATED: the client's cap, a
     * foreign stack of unknown end, the stack a signal handler interrupted). */
    UNWINDER_COPY_CUT,
    /* A stack not the thread's own, copied up to where its memory ends
     * (WIRE_ALLOC_UNKNOWN_STACK alone): a caller past the copy is past the stack. */
    UNWINDER_COPY_ENDS,
};

/* The kind of copy a WIRE_ALLOC record with @flags carries. */
static inline enum unwinder_copy unwinder_copy_of(uint32_t flags)
{
    if (flags & WIRE_ALLOC_STACK_TRUNCATED)
        return UNWINDER_COPY_CUT;
    return (flags & WIRE_ALLOC_UNKNOWN_STACK) ? UNWINDER_COPY_ENDS : UNWINDER_COPY_THREAD;
}

/* As unwinder_unwind(), for a copy of kind @copy. Past a CUT or ENDS copy the process's
 * memory is read only where a file backs it (a GOT slot), never its stacks or heap,
 * which have changed since the copy was taken. An unwind of a CUT copy that needs such
 * memory ends with an UNWINDER_TRUNCATED_FRAME (res->copy_truncated) instead of whatever
 * the process holds there now; one of an ENDS copy ends there, as at the outermost
 * frame. The rules of the frames found are published as after an unwind without error. */
int unwinder_unwind_copy(unwinder_process_t *p, const uint64_t regs[WIRE_NREGS], uint64_t stack_ptr,
                         const uint8_t *stack, size_t stack_len, enum unwinder_copy copy,
                         struct hp_frame *frames, size_t max_frames, size_t *ret_n,
                         struct unwinder_result *ret_res) HP_WARN_UNUSED;

/* Ends @frames (@n of at most @max, updated) with an UNWINDER_TRUNCATED_FRAME: a walk the
 * client sent that stops before the end of the stack (WIRE_PCS_PARTIAL). */
void unwinder_mark_truncated(struct hp_frame *frames, size_t *n, size_t max,
                             struct unwinder_result *res);

/* Makes @p publish, after every stack it unwinds without error, how to step from each
 * of its frames to the caller (where the CFI is simple enough) into the unwind table in
 * @fd (shmem_ring/utable.h; borrowed, mapped writable here), which the client uses to
 * walk its own stack. The table is flushed whenever the process's maps change. */
int unwinder_process_set_table(unwinder_process_t *p, int fd) HP_WARN_UNUSED;

/* Forgets everything published in @p's table (a new generation); the rules come back
 * as stacks are unwound again. No-op without a table. */
void unwinder_table_reset(unwinder_process_t *p);

/* The process says its code changed (WIRE_MAPS_CHANGED): rereads the maps now (with no
 * rate limit). The table is reset when executable mappings went away or changed, and
 * after an unload (@unloaded) in any case, even when the maps look the same (the client
 * waits for a new generation before it walks again). From then on the maps are not
 * reread for their age: the process tells of its loads and unloads in order. */
void unwinder_maps_changed(unwinder_process_t *p, bool unloaded);

/* File mappings the process's maps stop showing are kept, with the file behind them,
 * for the frames of records written before they went: a sample is taken while its
 * code is mapped, but read here later, when the code may be unloaded. (One that another
 * mapping now overlaps is not kept: the address belongs to the new one.) Every reread
 * that keeps some counts one retirement: unwinder_retired_seq() is the count so far. The
 * caller notes how far the records went when the count moved, and once it has read them
 * all lets go of the mappings kept up to then with unwinder_retired_drop(@seq). */
uint64_t unwinder_retired_seq(const unwinder_process_t *p);
void unwinder_retired_drop(unwinder_process_t *p, uint64_t seq);

/* Counters of the table publication, for statistics and tests. */
struct unwinder_table_stats {
    uint64_t published; /* rules written */
    uint64_t no_rule;   /* frames whose CFI has no simple rule */
    uint64_t flushes;   /* the maps changed */
    uint64_t frame_ptr; /* of the rules written, frame-pointer rules (code without CFI) */
};
void unwinder_table_stats(const unwinder_process_t *p, struct unwinder_table_stats *ret);

/* Frames of a stack the client walked itself (WIRE_ALLOC_PCS): @pcs[0] is the pc of
 * the innermost frame (the return address of the call that captured it), the others
 * are return addresses (every frame is that of pc - 1, as in unwinder_unwind()).
 * Leading libheapprof.so frames are skipped; a pc in no known executable mapping ends
 * the stack with an "ERROR INVALID_MAP" frame. Output and return as unwinder_unwind().
 * Never crashes on hostile input. */
int unwinder_resolve_pcs(unwinder_process_t *p, const uint64_t *pcs, size_t n_pcs,
                         struct hp_frame *frames, size_t max_frames, size_t *ret_n,
                         struct unwinder_result *ret_res) HP_WARN_UNUSED;

/* Functions of one inline chain unwinder_source_lines() gives at most: deeper chains
 * keep their innermost functions and the outermost one. */
#define UNWINDER_MAX_INLINE_DEPTH 32

/* Source positions of @rel_pc (a frame's rel_pc) in the file of mapping @m, from the
 * file's DWARF or its separate debug file's: the function inlined innermost at the pc
 * with the pc's own line first, then each function it was inlined into with the line
 * of that call, ending with the function the code belongs to (one position when no
 * inlining happened). Computed lazily and cached per (file, pc); the first lookup in a
 * file opens its debug info (tens of ms for a large compressed one), so call it at dump
 * time, never per sample. Sets @ret_lines (1 to UNWINDER_MAX_INLINE_DEPTH of them, with
 * interned strings; borrowed, valid until unwinder_global_done()) and @ret_n, and
 * returns 0; -ENOENT when the pc's line is unknown, -ECANCELED when switched off,
 * -ENOSPC past the cache's cap of (file, pc) pairs. Thread-safe. */
int unwinder_source_lines(const struct hp_mapping *m, uint64_t rel_pc,
                          const struct hp_source_line **ret_lines, size_t *ret_n) HP_WARN_UNUSED;

/* unwinder_source_lines() that never opens a file itself while the background thread
 * (unwinder_source_prefetch()) has it to open: -EAGAIN then, and the file is opened
 * without holding what lookups need, so a later call finds it. For dumps, which must
 * not wait for a nice-19 thread on a busy machine. */
int unwinder_source_lines_nowait(const struct hp_mapping *m, uint64_t rel_pc,
                                 const struct hp_source_line **ret_lines,
                                 size_t *ret_n) HP_WARN_UNUSED;

/* The first of unwinder_source_lines(): the file and line of the code at the pc. */
int unwinder_source_line(const struct hp_mapping *m, uint64_t rel_pc, const char **ret_file,
                         uint32_t *ret_line) HP_WARN_UNUSED;

/* Opens the debug info of @m's file in a low-priority background thread, so that the
 * first unwinder_source_line() in that file does not wait for it. Cheap when the file was
 * asked for before (a lock and a lookup); call it once per new mapping seen in a stack.
 * Thread-safe; does nothing when source lines are switched off. */
void unwinder_source_prefetch(const struct hp_mapping *m);

/* The off switch of unwinder_source_lines() (on by default). Thread-safe. */
void unwinder_set_source_lines(bool enabled);

/* ---- Python frames (unwinder/python.c) ---- */

/* The name of a Python frame whose code object could not be read. */
#define UNWINDER_PY_UNNAMED "<python frame>"

/* What unwinder_py_merge() did with one stack. */
struct unwinder_py_result {
    uint32_t named;   /* Python frames put in, named "qualname (file.py:line)" */
    uint32_t unnamed; /* Python frames put in as UNWINDER_PY_UNNAMED */
    /* The runs of CPython's evaluation loop in the native stack and the Python frames did
     * not pair up: the stack was left as it was. */
    bool mismatch;
};

/* The CPython runtime process @p told (WIRE_PY_RUNTIME). Returns 1 the first time, 0
 * after, -ENOMEM. */
int unwinder_py_runtime(unwinder_process_t *p, const struct wire_py_runtime *rt) HP_WARN_UNUSED;

/* What names the code object @c->code carries (WIRE_PY_CODE, decoded by
 * wire_decode_py_code(): the name, file and table are @c's lengths long, borrowed):
 * kept as the process's name of the code object with that address and check, so that
 * its frames are named without reading the process's memory. Returns 0, -EINVAL before
 * the runtime was told (unwinder_py_runtime()) or for code 0, -ENOMEM. */
int unwinder_py_code(unwinder_process_t *p, const struct wire_py_code *c, const char *qualname,
                     const char *filename, const uint8_t *linetable) HP_WARN_UNUSED;

/* Puts the Python frames @py (@n_py of them, innermost first, with the tail's
 * @tail_flags) into @frames (*@n native frames, leaf first; room for @max, at most
 * UNWINDER_MAX_FRAMES + 1) in place of the frames of CPython's evaluation loop
 * (_PyEval_EvalFrameDefault): each run of the loop takes the Python frames up to and
 * including its entry frame. Python frames are named from the process's memory as it is
 * now; their mappings are named after the source file and have no address range
 * (unwinder_is_py_mapping()). Returns 0; @ret says what happened. Never crashes on
 * hostile input. */
int unwinder_py_merge(unwinder_process_t *p, struct hp_frame *frames, size_t *n, size_t max,
                      const struct wire_py_frame *py, size_t n_py, uint32_t tail_flags,
                      struct unwinder_py_result *ret);

/* The line of the instruction @instr (code units; -1: before the first) of a code object
 * whose location table (CPython 3.11's format) is @table (@len bytes) and whose first line
 * is @first; 0 when it has none. */
int unwinder_py_line(const uint8_t *table, size_t len, int32_t first, int32_t instr);

/* The start and end of the mapping of a Python frame (a source file, no address range):
 * a mark no real mapping has (a mapping made up without a range, as tests and fuzz
 * targets make for their ELF files, is 0 to 0). */
#define UNWINDER_PY_MAPPING_MARK 1u

/* True for the mapping of a Python frame. */
static inline bool unwinder_is_py_mapping(const struct hp_mapping *m)
{
    return m && m->start == UNWINDER_PY_MAPPING_MARK && m->end == UNWINDER_PY_MAPPING_MARK;
}

/* Bytes of memory held by the global caches. */
size_t unwinder_global_bytes(void);

#endif
