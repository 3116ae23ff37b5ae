/* tests/fuzz/fuzz_record_decoder.c: the service's validation of ring records
 * (wire_decode_alloc, wire_decode_alloc_pcs, wire_decode_free, wire_decode_frees,
 * wire_decode_heap_name,
 * wire_decode_py_runtime, wire_decode_py_code with the naming of the code it accepts,
 * and wire_decode_py for the Python frames that end a
 * WIRE_ALLOC_PCS record with WIRE_PCS_PY, merged into its native frames by
 * unwinder_py_merge) on arbitrary payloads,
 * and the unwinding of every accepted WIRE_ALLOC (and the naming of every accepted
 * WIRE_ALLOC_PCS and audit walk) against a synthetic process (this process's own maps
 * and memory, with an unwind table to publish into), as the unwinder thread does it. A
 * record is accepted only when its stack fits both the payload and the cap, and its pcs
 * (an audit's or a WIRE_ALLOC_PCS's) are 1..WIRE_MAX_PCS and fit the payload; an
 * accepted one must give at least one frame and never crash.
 *
 * Input layout:
 *   byte 0       record type (low 4 bits: 1 WIRE_ALLOC, 2 WIRE_FREE, 3 WIRE_ALLOC_PCS,
 *                4 WIRE_MAPS_CHANGED, 6 WIRE_PY_RUNTIME, 7 WIRE_HEAP_NAME,
 *                8 WIRE_PY_CODE, 10 WIRE_FREES, others unknown)
 *   byte 1       the max_stack_bytes cap, in KiB (0..255)
 *   the rest     the payload, copied to a buffer of exactly its size
 */
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "service/svc_internal.h"
#include "shmem_ring/utable.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static unwinder_process_t *g_p;
static struct hp_frame g_frames[UNWINDER_MAX_FRAMES];

static void setup(void)
{
    if (g_p)
        return;
    if (unwinder_global_init() < 0)
        abort();
    int maps_fd = open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
    int mem_fd = open("/proc/self/mem", O_RDONLY | O_CLOEXEC);
    if (unwinder_process_new(getpid(), maps_fd, mem_fd, &g_p) < 0)
        abort();
    int table_fd;
    if (utable_create(UTABLE_MIN_SLOTS, &table_fd) < 0 ||
        unwinder_process_set_table(g_p, table_fd) < 0)
        abort();
    close(table_fd);
}

/* The frames of @pcs (in g_frames; returns their number) must be between 1 and
 * UNWINDER_MAX_FRAMES, also when the walk is marked partial (WIRE_PCS_PARTIAL). */
static size_t resolve(const uint64_t *pcs, size_t n_pcs, bool partial)
{
    size_t n = 0;
    struct unwinder_result res;
    if (unwinder_resolve_pcs(g_p, pcs, n_pcs, g_frames, UNWINDER_MAX_FRAMES, &n, &res) != 0 ||
        n < 1 || n > UNWINDER_MAX_FRAMES)
        abort();
    if (partial && !res.error) {
        unwinder_mark_truncated(g_frames, &n, UNWINDER_MAX_FRAMES, &res);
        if (n < 1 || n > UNWINDER_MAX_FRAMES)
            abort();
    }
    return n;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    setup();
    if (size < 2)
        return 0;
    unsigned type = data[0] & 15;
    uint64_t max_stack = (uint64_t)data[1] << 10;
    size_t len = size - 2;
    /* An exact-size copy, so reading past the payload is caught by the sanitizers. */
    uint8_t *payload = malloc(len ? len : 1);
    if (!payload)
        return 0;
    memcpy(payload, data + 2, len);

    uint64_t pcs[WIRE_MAX_PCS];
    if (type == WIRE_ALLOC) {
        struct wire_alloc a;
        const uint8_t *stack = NULL;
        size_t n_pcs = SIZE_MAX;
        int r = wire_decode_alloc(payload, len, max_stack, &a, &stack, pcs, &n_pcs);
        bool valid = len >= sizeof(a);
        size_t want_pcs = 0;
        if (valid) {
            struct wire_alloc raw;
            memcpy(&raw, payload, sizeof(raw));
            valid = raw.stack_len <= len - sizeof(raw) && raw.stack_len <= max_stack;
            if (valid && (raw.flags & WIRE_ALLOC_AUDIT)) {
                size_t rest = len - sizeof(raw) - raw.stack_len;
                uint64_t count = 0;
                if (rest >= sizeof(count))
                    memcpy(&count, payload + sizeof(raw) + raw.stack_len, sizeof(count));
                valid = rest >= sizeof(count) && count >= 1 && count <= WIRE_MAX_PCS &&
                        (rest - sizeof(count)) / sizeof(uint64_t) >= count;
                want_pcs = (size_t)count;
            }
        }
        if ((r == 0) != valid)
            abort();
        if (r == 0) {
            if (stack != payload + sizeof(a) || n_pcs != want_pcs)
                abort();
            size_t n = 0;
            struct unwinder_result res;
            if (unwinder_unwind_copy(g_p, a.regs, a.stack_ptr, stack, a.stack_len,
                                     unwinder_copy_of(a.flags), g_frames, UNWINDER_MAX_FRAMES, &n,
                                     &res) == 0 &&
                (n < 1 || n > UNWINDER_MAX_FRAMES))
                abort();
            if (n_pcs)
                (void)resolve(pcs, n_pcs, false);
        }
    } else if (type == WIRE_ALLOC_PCS) {
        /* Python frames end the record when its flags say so: split off first, as the
         * service does; a tail that does not fit refuses the record. */
        struct wire_py_tail tail = {0};
        static struct wire_py_frame py[WIRE_MAX_PY_FRAMES];
        struct wire_alloc_pcs head;
        bool with_py =
            len >= sizeof(head) && (memcpy(&head, payload, sizeof(head)), head.flags & WIRE_PCS_PY);
        if (with_py) {
            size_t rest = len;
            if (wire_decode_py(payload, len, &tail, py, &rest) < 0) {
                free(payload);
                return 0;
            }
            if (tail.n_frames > WIRE_MAX_PY_FRAMES || rest > len)
                abort();
            len = rest;
        }
        struct wire_alloc_pcs a;
        int r = wire_decode_alloc_pcs(payload, len, &a, pcs);
        bool valid = len >= sizeof(a);
        if (valid) {
            struct wire_alloc_pcs raw;
            memcpy(&raw, payload, sizeof(raw));
            valid = raw.n_pcs >= 1 && raw.n_pcs <= WIRE_MAX_PCS &&
                    (len - sizeof(raw)) / sizeof(uint64_t) >= raw.n_pcs;
        }
        if ((r == 0) != valid)
            abort();
        if (r == 0) {
            if (memcmp(pcs, payload + sizeof(a), a.n_pcs * sizeof(uint64_t)) != 0)
                abort();
            size_t n = resolve(pcs, a.n_pcs, (a.flags & WIRE_PCS_PARTIAL) != 0);
            if (with_py) {
                struct unwinder_py_result pr;
                if (unwinder_py_merge(g_p, g_frames, &n, UNWINDER_MAX_FRAMES, py, tail.n_frames,
                                      tail.flags, &pr) != 0 ||
                    n < 1 || n > UNWINDER_MAX_FRAMES)
                    abort();
            }
        }
    } else if (type == WIRE_MAPS_CHANGED) {
        struct wire_maps_changed mc;
        int r = wire_decode_maps_changed(payload, len, &mc);
        if ((r == 0) != (len >= sizeof(mc)))
            abort();
        if (r == 0)
            unwinder_maps_changed(g_p, (mc.flags & WIRE_MAPS_UNLOADED) != 0);
    } else if (type == WIRE_HEAP_NAME) {
        /* Accepted: heap > 0 and a NUL-free name of 1..63 bytes, NUL-terminated. */
        struct wire_heap_name h;
        int r = wire_decode_heap_name(payload, len, &h);
        if (r == 0 && (len < sizeof(h) || h.heap_id == 0 || h.len == 0 ||
                       h.len >= WIRE_HEAP_NAME_MAX || strlen(h.name) != h.len))
            abort();
    } else if (type == WIRE_PY_RUNTIME) {
        struct wire_py_runtime rt;
        int r = wire_decode_py_runtime(payload, len, &rt);
        if ((r == 0) != (len >= sizeof(rt)))
            abort();
        int told = r == 0 ? unwinder_py_runtime(g_p, &rt) : 0;
        if (told != 0 && told != 1)
            abort();
    } else if (type == WIRE_PY_CODE) {
        /* Accepted: lengths in bounds adding up to the payload, printable names; then
         * kept, and a frame of it named from what it carries. */
        struct wire_py_code c;
        const char *q, *f;
        const uint8_t *lt;
        int r = wire_decode_py_code(payload, len, &c, &q, &f, &lt);
        if (r == 0 &&
            (c.qualname_len == 0 || c.qualname_len > WIRE_PY_NAME_MAX || c.filename_len == 0 ||
             c.filename_len > WIRE_PY_PATH_MAX || c.linetable_len > WIRE_PY_LINETABLE_MAX ||
             len != sizeof(c) + c.qualname_len + c.filename_len + c.linetable_len))
            abort();
        if (r == 0 && c.code != 0) {
            /* The runtime first, as a client tells it; then one frame of the code. */
            struct wire_py_runtime rt = {.hexversion = 0x030b0000, .status = WIRE_PY_OK};
            if (unwinder_py_runtime(g_p, &rt) < 0 || unwinder_py_code(g_p, &c, q, f, lt) != 0)
                abort();
            const char *eval = "_PyEval_EvalFrameDefault";
            g_frames[0] = (struct hp_frame){.function_name = eval};
            struct wire_py_frame py = {.code = c.code,
                                       .instr = (int32_t)(c.linetable_len / 2),
                                       .flags = WIRE_PYF_ENTRY | c.check << WIRE_PYF_CHECK_SHIFT};
            size_t n = 1;
            struct unwinder_py_result pr;
            if (unwinder_py_merge(g_p, g_frames, &n, UNWINDER_MAX_FRAMES, &py, 1, 0, &pr) != 0 ||
                n != 1 || pr.named != 1 || g_frames[0].function_name == NULL ||
                strncmp(g_frames[0].function_name, q, c.qualname_len) != 0)
                abort();
        }
    } else if (type == WIRE_FREES) {
        /* Accepted exactly when 1..WIRE_MAX_FREES addresses fit the payload, copied as
         * they are. */
        struct wire_frees f;
        uint64_t addrs[WIRE_MAX_FREES];
        int r = wire_decode_frees(payload, len, &f, addrs);
        uint32_t n = 0;
        if (len >= sizeof(f))
            memcpy(&n, payload, sizeof(n));
        bool fits = len >= sizeof(f) && n >= 1 && n <= WIRE_MAX_FREES && len >= wire_frees_len(n);
        if ((r == 0) != fits)
            abort();
        if (r == 0 && (f.n != n || memcmp(addrs, payload + sizeof(f), n * sizeof(uint64_t)) != 0))
            abort();
    } else if (type == WIRE_FREE) {
        struct wire_free f;
        int r = wire_decode_free(payload, len, &f);
        if ((r == 0) != (len >= sizeof(f)))
            abort();
        if (r == 0 && memcmp(&f, payload, sizeof(f)) != 0)
            abort();
    }
    free(payload);
    return 0;
}
