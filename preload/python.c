/* preload/python.c: see python.h. The offsets below are those of CPython 3.11's release
 * builds (Include/internal/pycore_frame.h, Include/cpython/pystate.h,
 * Include/cpython/code.h), the same in every 3.11.x; a debug build adds fields and is
 * refused. The sizes of the code type are checked on the live interpreter before any
 * frame is read. */
#include "preload/python.h"

#include <errno.h>
#include <link.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/uio.h>

#include "common/macros.h"
#include "common/sys.h"
#include "preload/elfobj.h"

/* PyThreadState: cframe, datastack_chunk, root_cframe */
#define PY311_TSTATE_CFRAME 56
#define PY311_TSTATE_DATASTACK_CHUNK 296
#define PY311_TSTATE_ROOT_CFRAME 336
/* _PyStackChunk: size, then the frames from data on */
#define PY311_CHUNK_SIZE 8
#define PY311_CHUNK_DATA 24
/* _PyCFrame */
#define PY311_CFRAME_CURRENT 8
/* _PyInterpreterFrame: f_code, previous, prev_instr, is_entry; read from f_code on. */
#define PY311_FRAME_CODE 32
#define PY311_FRAME_PREVIOUS 48
#define PY311_FRAME_PREV_INSTR 56
#define PY311_FRAME_IS_ENTRY 68
#define PY311_FRAME_READ (PY311_FRAME_IS_ENTRY + 1 - PY311_FRAME_CODE)
/* PyObject.ob_type; PyTypeObject.tp_basicsize, tp_itemsize */
#define PY_OB_TYPE 8
#define PY_TP_BASICSIZE 32
#define PY_TP_ITEMSIZE 40
/* PyCodeObject: where its bytecode (co_code_adaptive) starts, which is the code type's
 * tp_basicsize. */
#define PY311_CODE_ADAPTIVE 184
#define PY_CODEUNIT 2

typedef void *(*py_tstate_fn)(void);

static _Atomic int py_state;
static _Atomic bool py_busy; /* one detection at a time */
static py_tstate_fn py_get_tstate;
/* The object allocator's API and the thread that holds the GIL (preload/pyheap.c). */
static struct client_py_mem py_mem;
static py_tstate_fn py_gil_tstate;
static uint64_t py_code_type;
static uint32_t py_hexversion, py_status;
/* process_vm_readv(2) refused for good (seccomp, an old kernel): no capture. */
static _Atomic bool py_no_read;

int client_py_state(void)
{
    return atomic_load_explicit(&py_state, memory_order_acquire);
}

void client_py_runtime(struct wire_py_runtime *ret)
{
    *ret = (struct wire_py_runtime){
        .hexversion = py_hexversion,
        .status = py_status,
        .code_type = py_status == WIRE_PY_OK ? py_code_type : 0,
    };
}

struct py_found {
    const unsigned long *version;
    void *tstate_fn;
    const uint8_t *code_type;
    bool debug;
    struct client_py_mem mem;
    void *gil_tstate_fn;
};

/* The first object that defines both the code type and the thread state getter: the
 * runtime (the executable with a static libpython, or libpython). */
static int py_detect_cb(struct dl_phdr_info *info, size_t size, void *arg)
{
    (void)size;
    struct py_found *f = arg;
    struct client_elfobj o;
    if (client_elfobj_init(&o, info) < 0)
        return 0;
    void *code_type = client_elfobj_lookup_data(&o, "PyCode_Type");
    void *fn = client_elfobj_lookup(&o, "PyGILState_GetThisThreadState");
    if (!code_type || !fn)
        return 0;
    f->code_type = code_type;
    f->tstate_fn = fn;
    f->version = client_elfobj_lookup_data(&o, "Py_Version");
    /* Py_REF_DEBUG (every debug build) keeps a total of references. */
    f->debug = client_elfobj_lookup_data(&o, "_Py_RefTotal") != NULL;
    f->mem.get_allocator = client_elfobj_lookup(&o, "PyMem_GetAllocator");
    f->mem.set_allocator = client_elfobj_lookup(&o, "PyMem_SetAllocator");
    f->gil_tstate_fn = client_elfobj_lookup(&o, "_PyThreadState_UncheckedGet");
    return 1;
}

/* The state the runtime in @f gets. */
static int py_judge(const struct py_found *f)
{
    /* Py_Version came with 3.11: an older runtime has none. */
    py_hexversion = f->version ? (uint32_t)*f->version : 0;
    if ((py_hexversion >> 16) != 0x030b) {
        py_status = WIRE_PY_VERSION;
        return CLIENT_PY_UNSUPPORTED;
    }
    if (f->debug) {
        py_status = WIRE_PY_DEBUG_BUILD;
        return CLIENT_PY_UNSUPPORTED;
    }
    int64_t basic, item;
    memcpy(&basic, f->code_type + PY_TP_BASICSIZE, sizeof(basic));
    memcpy(&item, f->code_type + PY_TP_ITEMSIZE, sizeof(item));
    if (basic != PY311_CODE_ADAPTIVE || item != PY_CODEUNIT) {
        py_status = WIRE_PY_LAYOUT;
        return CLIENT_PY_UNSUPPORTED;
    }
    py_status = WIRE_PY_OK;
    py_code_type = (uint64_t)(uintptr_t)f->code_type;
    py_get_tstate = (py_tstate_fn)f->tstate_fn;
    if (f->mem.get_allocator && f->mem.set_allocator && f->gil_tstate_fn) {
        py_mem = f->mem;
        py_gil_tstate = (py_tstate_fn)f->gil_tstate_fn;
    }
    return CLIENT_PY_READY;
}

void client_py_detect(int again)
{
    int st = atomic_load_explicit(&py_state, memory_order_acquire);
    if (st != CLIENT_PY_UNKNOWN && !(again && st == CLIENT_PY_NONE))
        return;
    if (atomic_exchange_explicit(&py_busy, true, memory_order_acquire))
        return;
    struct py_found f = {0};
    (void)dl_iterate_phdr(py_detect_cb, &f);
    st = f.code_type ? py_judge(&f) : CLIENT_PY_NONE;
    /* Release: the runtime's addresses before the state that lets samples use them. */
    atomic_store_explicit(&py_state, st, memory_order_release);
    atomic_store_explicit(&py_busy, false, memory_order_release);
}

const struct client_py_mem *client_py_mem(void)
{
    return py_mem.get_allocator ? &py_mem : NULL;
}

bool client_py_holds_gil(void)
{
    /* The runtime's current thread state is the GIL holder's (NULL when released, or
     * before initialisation); the thread's own comes from its key, as in capture. */
    if (!py_gil_tstate)
        return false;
    void *cur = py_gil_tstate();
    return cur != NULL && cur == py_get_tstate();
}

/* Reads @len bytes at @src into @dst without faulting; false when not all could be. */
static bool py_read(pid_t pid, void *dst, uint64_t src, size_t len)
{
    struct iovec local = {.iov_base = dst, .iov_len = len};
    struct iovec remote = {.iov_base = (void *)(uintptr_t)src, .iov_len = len};
    long n = hp_sys6(SYS_process_vm_readv, pid, (long)&local, 1, (long)&remote, 1, 0);
    if (n == -EPERM || n == -ENOSYS)
        atomic_store_explicit(&py_no_read, true, memory_order_relaxed);
    return n == (long)len;
}

/* What is read of each code object, in one piece: from its type to its qualified name
 * (ob_type at 8, co_firstlineno at 72, co_filename at 112, co_qualname at 128). */
#define PY311_CODE_FIRSTLINENO 72
#define PY311_CODE_FILENAME 112
#define PY311_CODE_QUALNAME 128
#define PY_CODE_HEAD_FROM PY_OB_TYPE
#define PY_CODE_HEAD_LEN (PY311_CODE_QUALNAME + 8 - PY_CODE_HEAD_FROM)

static uint64_t py_get64(const uint8_t *b, size_t off)
{
    uint64_t v;
    memcpy(&v, b + off - PY_CODE_HEAD_FROM, sizeof(v));
    return v;
}

struct client_pycodes client_py_codes;

/* How many of @frames[0..n) (n <= WIRE_MAX_PY_FRAMES) from the first on have a code
 * object of the code type; adds each one's wire_py_check() to its flags. With @known,
 * those in client_py_codes are taken from there. The others are read, and kept there
 * when the thread holds the GIL (pycodes.h). One system call for all the others: a
 * sample's cost is mostly its system calls (the kernel pins each page read). @ret_send
 * as in client_py_capture(); the GIL is asked about only when some code is not marked
 * sent, which is rare after a session's first samples. */
static size_t py_check_codes(pid_t pid, struct wire_py_frame *frames, size_t n, bool known,
                             uint64_t epoch, uint64_t *ret_send)
{
    struct iovec local[WIRE_MAX_PY_FRAMES], remote[WIRE_MAX_PY_FRAMES];
    uint8_t h[WIRE_MAX_PY_FRAMES][PY_CODE_HEAD_LEN];
    uint8_t at[WIRE_MAX_PY_FRAMES]; /* the frame of each read */
    size_t m = 0;
    uint64_t unsent = 0;
    *ret_send = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t check;
        if (known && client_pycodes_lookup(&client_py_codes, frames[i].code, &check)) {
            frames[i].flags |= check << WIRE_PYF_CHECK_SHIFT;
            if (!client_pycodes_sent(&client_py_codes, frames[i].code, check, epoch))
                unsent |= 1ull << i;
            continue;
        }
        local[m] = (struct iovec){.iov_base = h[m], .iov_len = PY_CODE_HEAD_LEN};
        remote[m] =
            (struct iovec){.iov_base = (void *)(uintptr_t)(frames[i].code + PY_CODE_HEAD_FROM),
                           .iov_len = PY_CODE_HEAD_LEN};
        at[m++] = (uint8_t)i;
    }
    size_t ok = 0, end = n;
    if (m > 0) {
        long got =
            hp_sys6(SYS_process_vm_readv, pid, (long)local, (long)m, (long)remote, (long)m, 0);
        ok = got > 0 ? (size_t)got / PY_CODE_HEAD_LEN : 0;
        end = ok < m ? at[ok] : n;
    }
    /* Kept only by the GIL's holder: all frees are made under it (pycodes.h). */
    bool keep = (ok > 0 || unsent != 0) && client_py_holds_gil();
    for (size_t j = 0; j < ok; j++) {
        if (py_get64(h[j], PY_OB_TYPE) != py_code_type) {
            end = at[j];
            break;
        }
        int32_t first;
        memcpy(&first, h[j] + PY311_CODE_FIRSTLINENO - PY_CODE_HEAD_FROM, sizeof(first));
        uint32_t check = wire_py_check(py_get64(h[j], PY311_CODE_FILENAME),
                                       py_get64(h[j], PY311_CODE_QUALNAME), first);
        frames[at[j]].flags |= check << WIRE_PYF_CHECK_SHIFT;
        if (keep) {
            client_pycodes_put(&client_py_codes, frames[at[j]].code, check);
            if (!client_pycodes_sent(&client_py_codes, frames[at[j]].code, check, epoch))
                unsent |= 1ull << at[j];
        }
    }
    if (keep)
        *ret_send = end < 64 ? unsent & ((1ull << end) - 1) : unsent;
    return end;
}

/* PyASCIIObject: length, state bits, the text of a compact ASCII string; PyBytesObject:
 * ob_size, ob_sval. */
#define PY_STR_LENGTH 16
#define PY_STR_STATE 32
#define PY_STR_ASCII_DATA 48
#define PY_BYTES_SIZE 16
#define PY_BYTES_DATA 32
#define PY311_CODE_LINETABLE 136

/* The length of the compact ASCII string whose head is @h, 1..@max; 0 when it is not
 * one or is longer. */
static uint32_t py_ascii_len(const uint8_t *h, uint32_t max)
{
    int64_t len;
    uint32_t state;
    memcpy(&len, h + PY_STR_LENGTH, sizeof(len));
    memcpy(&state, h + PY_STR_STATE, sizeof(state));
    bool compact = state >> 5 & 1, ascii = state >> 6 & 1;
    return compact && ascii && len > 0 && len <= (int64_t)max ? (uint32_t)len : 0;
}

bool client_py_code_plan(pid_t pid, uint64_t code, uint32_t check, struct client_py_code *ret)
{
    uint8_t h[PY311_CODE_LINETABLE + 8];
    if (!py_read(pid, h, code, sizeof(h)))
        return false;
    uint64_t type, file, qual, table;
    int32_t first;
    memcpy(&type, h + PY_OB_TYPE, sizeof(type));
    memcpy(&first, h + PY311_CODE_FIRSTLINENO, sizeof(first));
    memcpy(&file, h + PY311_CODE_FILENAME, sizeof(file));
    memcpy(&qual, h + PY311_CODE_QUALNAME, sizeof(qual));
    memcpy(&table, h + PY311_CODE_LINETABLE, sizeof(table));
    if (type != py_code_type || wire_py_check(file, qual, first) != check || table == 0)
        return false;
    uint8_t qh[PY_STR_ASCII_DATA], fh[PY_STR_ASCII_DATA], th[PY_BYTES_DATA];
    struct iovec local[3] = {{qh, sizeof(qh)}, {fh, sizeof(fh)}, {th, sizeof(th)}};
    struct iovec remote[3] = {{(void *)(uintptr_t)qual, sizeof(qh)},
                              {(void *)(uintptr_t)file, sizeof(fh)},
                              {(void *)(uintptr_t)table, sizeof(th)}};
    long got = hp_sys6(SYS_process_vm_readv, pid, (long)local, 3, (long)remote, 3, 0);
    if (got != (long)(sizeof(qh) + sizeof(fh) + sizeof(th)))
        return false;
    int64_t tlen;
    memcpy(&tlen, th + PY_BYTES_SIZE, sizeof(tlen));
    uint32_t ql = py_ascii_len(qh, WIRE_PY_NAME_MAX), fl = py_ascii_len(fh, WIRE_PY_PATH_MAX);
    if (ql == 0 || fl == 0 || tlen < 0 || tlen > (int64_t)WIRE_PY_LINETABLE_MAX)
        return false;
    *ret = (struct client_py_code){
        .head = {.code = code,
                 .check = check,
                 .firstlineno = first,
                 .qualname_len = ql,
                 .filename_len = fl,
                 .linetable_len = (uint32_t)tlen},
        .qualname = qual + PY_STR_ASCII_DATA,
        .filename = file + PY_STR_ASCII_DATA,
        .linetable = table + PY_BYTES_DATA,
    };
    return true;
}

bool client_py_code_fill(pid_t pid, const struct client_py_code *c, uint8_t *dst)
{
    const struct wire_py_code *w = &c->head;
    uint8_t *q = dst + sizeof(*w), *f = q + w->qualname_len, *t = f + w->filename_len;
    struct iovec local[3] = {{q, w->qualname_len}, {f, w->filename_len}, {t, w->linetable_len}};
    struct iovec remote[3] = {{(void *)(uintptr_t)c->qualname, w->qualname_len},
                              {(void *)(uintptr_t)c->filename, w->filename_len},
                              {(void *)(uintptr_t)c->linetable, w->linetable_len}};
    size_t want = (size_t)w->qualname_len + w->filename_len + w->linetable_len;
    long got = hp_sys6(SYS_process_vm_readv, pid, (long)local, w->linetable_len ? 3 : 2,
                       (long)remote, w->linetable_len ? 3 : 2, 0);
    bool ok = got == (long)want;
    /* ASCII by the string's state; control characters would be refused by the service. */
    for (size_t i = 0; ok && i < (size_t)w->qualname_len + w->filename_len; i++)
        ok = q[i] >= 0x20 && q[i] <= 0x7e;
    struct wire_py_code head = *w;
    if (!ok) {
        head.code = 0;
        memset(q, '?', want);
    }
    memcpy(dst, &head, sizeof(head));
    return ok;
}

/* Where the thread's frames may be read with plain loads: its current chunk of the
 * frame stack, [lo, hi). */
struct py_direct {
    uint64_t lo, hi;
};

/* Reads the @len bytes at @src into @dst: a plain copy when they lie in @d, else through
 * py_read(). */
static bool py_read_at(pid_t pid, const struct py_direct *d, void *dst, uint64_t src, size_t len)
{
    if (src >= d->lo && src < d->hi && d->hi - src >= len) {
        memcpy(dst, (const void *)(uintptr_t)src, len);
        return true;
    }
    return py_read(pid, dst, src, len);
}

size_t client_py_capture(pid_t pid, uint64_t stack_lo, uint64_t stack_hi,
                         struct wire_py_frame *frames, size_t max, bool known, uint64_t epoch,
                         uint32_t *ret_flags, uint64_t *ret_send)
{
    *ret_flags = 0;
    *ret_send = 0;
    if (atomic_load_explicit(&py_no_read, memory_order_relaxed))
        return 0;
    uint64_t tstate = (uint64_t)(uintptr_t)py_get_tstate();
    if (tstate == 0)
        return 0;
    /* The thread state the thread's key names is alive (CPython clears the key before it
     * frees it) and only the thread writes the fields read: plain loads. */
    const volatile uint64_t *ts = (const volatile uint64_t *)(uintptr_t)tstate;
    uint64_t cframe = ts[PY311_TSTATE_CFRAME / 8];
    uint64_t chunk = ts[PY311_TSTATE_DATASTACK_CHUNK / 8];
    struct py_direct d = {0};
    /* The chunk the thread pushes its frames on now, mapped while it is the thread's. */
    if (chunk != 0 && (chunk & 7) == 0) {
        uint64_t size = *(const volatile uint64_t *)(uintptr_t)(chunk + PY311_CHUNK_SIZE);
        if (size > PY311_CHUNK_DATA && chunk + size > chunk)
            d = (struct py_direct){.lo = chunk + PY311_CHUNK_DATA, .hi = chunk + size};
    }
    uint64_t frame;
    if (cframe == 0)
        return 0;
    /* The C frame is an evaluation loop's local, on the thread's stack above the sample's
     * (checked readable), or the thread state's root one: else read with care (a greenlet
     * may have moved stacks). */
    if ((cframe >= stack_lo && cframe < stack_hi && stack_hi - cframe >= 16 && (cframe & 7) == 0) ||
        cframe == tstate + PY311_TSTATE_ROOT_CFRAME)
        frame = *(const volatile uint64_t *)(uintptr_t)(cframe + PY311_CFRAME_CURRENT);
    else if (!py_read(pid, &frame, cframe + PY311_CFRAME_CURRENT, sizeof(frame)))
        return 0;
    size_t n = 0;
    uint32_t flags = 0;
    for (; frame != 0; n++) {
        if (n == max) {
            flags |= WIRE_PYT_TRUNCATED;
            break;
        }
        uint8_t b[PY311_FRAME_READ];
        if (!py_read_at(pid, &d, b, frame + PY311_FRAME_CODE, sizeof(b))) {
            flags |= WIRE_PYT_BROKEN;
            break;
        }
        uint64_t code, prev, instr;
        memcpy(&code, b, sizeof(code));
        memcpy(&prev, b + PY311_FRAME_PREVIOUS - PY311_FRAME_CODE, sizeof(prev));
        memcpy(&instr, b + PY311_FRAME_PREV_INSTR - PY311_FRAME_CODE, sizeof(instr));
        int64_t units = ((int64_t)(instr - code) - PY311_CODE_ADAPTIVE) / PY_CODEUNIT;
        if (units < -1 || units > INT32_MAX)
            units = -1;
        frames[n] = (struct wire_py_frame){
            .code = code,
            .instr = (int32_t)units,
            .flags = b[PY311_FRAME_IS_ENTRY - PY311_FRAME_CODE] ? WIRE_PYF_ENTRY : 0,
        };
        frame = prev;
    }
    size_t ok = py_check_codes(pid, frames, n, known, epoch, ret_send);
    if (ok < n) {
        n = ok;
        flags = (flags & ~(uint32_t)WIRE_PYT_TRUNCATED) | WIRE_PYT_BROKEN;
    }
    *ret_flags = flags;
    return n;
}
