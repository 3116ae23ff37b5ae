/* unwinder/python.c: naming the Python frames a client captured (CPython 3.11,
 * preload/python.h) and putting them into the native stack in place of the evaluation
 * loop's frames.
 *
 * A frame is a code object's address and an instruction. Without its WIRE_PY_CODE, the
 * code object is read from the process's memory (its /proc/PID/mem) when the record is
 * read: the code is still alive then almost always, and where it is not, its type no
 * longer matches and the frame goes unnamed. Names are cached per code address and the
 * check the client read there (wire_py_check(): the addresses of its name and file and
 * its first line): an address freed and reused by another code object comes with another
 * check, and gets the new name. Lines come from the code's location table (the 3.11
 * format, Objects/locations.md in CPython).
 *
 * The client also tells what names a code object the first time a session samples it
 * (WIRE_PY_CODE, unwinder_py_code()), before the sample: the cache entry is filled from
 * that, and frames are named even when the object was freed, or the process exited,
 * before the service read the sample. Entries the cache evicted (one per slot) are
 * read from the process again.
 *
 * Frames are named "qualname (file.py:line)", with a mapping of their own named after the
 * full path of the file and no address range (unwinder_py_mapping()), so that every
 * reader shows function, file and line without source-line packets.
 *
 * Not thread-safe per process, as the rest of unwinder_process_t.
 */
#include "unwinder/unwinder_internal.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/containers.h"
#include "common/macros.h"

/* PyCodeObject (3.11 release builds): the fields read, all within its first bytes. */
#define PY_OB_TYPE 8
#define PY_CODE_FIRSTLINENO 72
#define PY_CODE_FILENAME 112
#define PY_CODE_QUALNAME 128
#define PY_CODE_LINETABLE 136
#define PY_CODE_HEAD 144
/* PyBytesObject: ob_size, ob_sval. */
#define PY_BYTES_SIZE 16
#define PY_BYTES_DATA 32
/* PyASCIIObject / PyCompactUnicodeObject: length, state bits, where the data starts. */
#define PY_STR_LENGTH 16
#define PY_STR_STATE 32
#define PY_STR_ASCII_DATA 48
#define PY_STR_COMPACT_DATA 72

/* Caps on what a client's memory can make us read and keep. */
#define PY_NAME_MAX 256
#define PY_PATH_MAX 1024
#define PY_LINETABLE_MAX (64u << 10)
#define PY_CODE_SLOTS 1024 /* power of two */
#define PY_NAME_SLOTS 2048 /* power of two */

struct py_code {
    uint64_t addr; /* 0: empty */
    uint64_t filename, qualname, linetable;
    int32_t firstlineno;
    uint32_t check; /* wire_py_check() of the object */
    uint32_t gen;   /* names cached for this fill */
    const char *qualname_s, *base;
    const struct hp_mapping *map;
    uint8_t *table;
    uint32_t table_len;
};

struct py_name {
    uint64_t code;
    int32_t instr;
    uint32_t gen;
    const char *name;
    int line; /* of @instr, as in @name (0: none) */
};

struct unwinder__py {
    struct wire_py_runtime rt;
    bool told;
    uint32_t gen;
    struct py_code codes[PY_CODE_SLOTS];
    struct py_name names[PY_NAME_SLOTS];
    struct hp_frame scratch[UNWINDER_MAX_FRAMES + 1];
};

void unwinder__py_free(struct unwinder__py *py)
{
    if (!py)
        return;
    for (size_t i = 0; i < PY_CODE_SLOTS; i++)
        free(py->codes[i].table);
    unwinder__account(-(ssize_t)sizeof(*py));
    free(py);
}

int unwinder_py_runtime(unwinder_process_t *p, const struct wire_py_runtime *rt)
{
    if (!p->py) {
        p->py = calloc(1, sizeof(*p->py));
        if (!p->py)
            return -ENOMEM;
        unwinder__account((ssize_t)sizeof(*p->py));
    }
    bool first = !p->py->told;
    p->py->rt = *rt;
    p->py->told = true;
    return first ? 1 : 0;
}

static bool py_read(const unwinder_process_t *p, void *dst, uint64_t addr, size_t len)
{
    if (p->mem_fd < 0 || addr > (uint64_t)INT64_MAX - len)
        return false;
    return pread(p->mem_fd, dst, len, (off_t)addr) == (ssize_t)len;
}

static uint64_t get64(const uint8_t *b, size_t off)
{
    uint64_t v;
    memcpy(&v, b + off, sizeof(v));
    return v;
}

/* Appends code point @c as UTF-8 to @out (room for @cap bytes, @n used). */
static void put_utf8(char *out, size_t cap, size_t *n, uint32_t c)
{
    char b[4];
    size_t k;
    if (c < 0x80) {
        b[0] = (char)c;
        k = 1;
    } else if (c < 0x800) {
        b[0] = (char)(0xc0 | c >> 6);
        b[1] = (char)(0x80 | (c & 0x3f));
        k = 2;
    } else if (c < 0x10000) {
        b[0] = (char)(0xe0 | c >> 12);
        b[1] = (char)(0x80 | (c >> 6 & 0x3f));
        b[2] = (char)(0x80 | (c & 0x3f));
        k = 3;
    } else {
        c = c > 0x10ffff ? 0xfffd : c;
        b[0] = (char)(0xf0 | c >> 18);
        b[1] = (char)(0x80 | (c >> 12 & 0x3f));
        b[2] = (char)(0x80 | (c >> 6 & 0x3f));
        b[3] = (char)(0x80 | (c & 0x3f));
        k = 4;
    }
    if (*n + k <= cap) {
        memcpy(out + *n, b, k);
        *n += k;
    }
}

/* The text of the str object at @addr, as UTF-8 into @out (@cap bytes, cut there):
 * its length, or -1 when it is not a compact string we can read. */
static ssize_t py_str(const unwinder_process_t *p, uint64_t addr, char *out, size_t cap)
{
    uint8_t h[PY_STR_ASCII_DATA];
    if (addr == 0 || !py_read(p, h, addr, sizeof(h)))
        return -1;
    int64_t len;
    uint32_t state;
    memcpy(&len, h + PY_STR_LENGTH, sizeof(len));
    memcpy(&state, h + PY_STR_STATE, sizeof(state));
    unsigned kind = state >> 2 & 7, compact = state >> 5 & 1, ascii = state >> 6 & 1;
    if (!compact || len < 0)
        return -1;
    if (ascii) {
        size_t n = (size_t)len < cap ? (size_t)len : cap;
        return py_read(p, out, addr + PY_STR_ASCII_DATA, n) ? (ssize_t)n : -1;
    }
    if (kind != 1 && kind != 2 && kind != 4)
        return -1;
    uint8_t raw[PY_PATH_MAX * 4];
    size_t chars = (size_t)len < PY_PATH_MAX ? (size_t)len : PY_PATH_MAX;
    if (!py_read(p, raw, addr + PY_STR_COMPACT_DATA, chars * kind))
        return -1;
    size_t n = 0;
    for (size_t i = 0; i < chars; i++) {
        uint32_t c = 0;
        memcpy(&c, raw + i * kind, kind); /* little-endian */
        put_utf8(out, cap, &n, c);
    }
    return (ssize_t)n;
}

/* ---- the location table ---------------------------------------------------------- */

static uint32_t py_varint(const uint8_t *t, size_t len, size_t *i)
{
    uint32_t v = 0;
    for (unsigned shift = 0; *i < len && shift < 32; shift += 6) {
        uint8_t b = t[(*i)++];
        v |= (uint32_t)(b & 63) << shift;
        if (!(b & 64))
            break;
    }
    return v;
}

static int32_t py_svarint(const uint8_t *t, size_t len, size_t *i)
{
    uint32_t u = py_varint(t, len, i);
    return (u & 1) ? -(int32_t)(u >> 1) : (int32_t)(u >> 1);
}

int unwinder_py_line(const uint8_t *t, size_t len, int32_t first, int32_t instr)
{
    if (instr < 0)
        return first;
    int64_t line = first;
    uint64_t addr = 0;
    for (size_t i = 0; i < len;) {
        uint8_t b = t[i++];
        if (!(b & 0x80))
            return 0; /* not the start of an entry */
        unsigned code = b >> 3 & 15, units = (b & 7) + 1u;
        bool none = false;
        switch (code) {
        case 15: /* no location */
            none = true;
            break;
        case 14: /* long form: line delta, end line delta, column, end column */
            line += py_svarint(t, len, &i);
            for (int k = 0; k < 3; k++)
                (void)py_varint(t, len, &i);
            break;
        case 13: /* no column */
            line += py_svarint(t, len, &i);
            break;
        case 10:
        case 11:
        case 12: /* one line: the delta in the code, two bytes of columns */
            line += code - 10;
            i += 2;
            break;
        default: /* short form: same line, one byte of columns */
            i += 1;
            break;
        }
        if ((uint64_t)instr < addr + units)
            return none || line < 0 || line > INT32_MAX ? 0 : (int)line;
        addr += units;
    }
    return 0;
}

/* ---- code objects ------------------------------------------------------------------ */

/* Names @c after @qualname (@nl bytes) and @path (@pl bytes). */
static void py_set_names(struct py_code *c, const char *name, size_t nl, const char *path,
                         size_t pl)
{
    c->qualname_s = unwinder__intern(name, nl);
    const char *slash = memrchr(path, '/', pl);
    size_t off = slash ? (size_t)(slash + 1 - path) : 0;
    c->base = unwinder__intern(path + off, pl - off);
    struct hp_mapping m = {.start = UNWINDER_PY_MAPPING_MARK,
                           .end = UNWINDER_PY_MAPPING_MARK,
                           .path = unwinder__intern(path, pl)};
    c->map = unwinder__mapping_intern(&m);
}

/* Fills @c from the code object at @addr whose head is @h. Returns false when its
 * strings cannot be read. */
static bool py_fill(unwinder_process_t *p, struct py_code *c, uint64_t addr, const uint8_t *h)
{
    char name[PY_NAME_MAX], path[PY_PATH_MAX];
    ssize_t nl = py_str(p, get64(h, PY_CODE_QUALNAME), name, sizeof(name));
    ssize_t pl = py_str(p, get64(h, PY_CODE_FILENAME), path, sizeof(path));
    if (nl < 0 || pl < 0)
        return false;
    uint8_t bh[PY_BYTES_DATA];
    uint64_t lt = get64(h, PY_CODE_LINETABLE);
    int64_t tlen = 0;
    if (lt && py_read(p, bh, lt, sizeof(bh)))
        memcpy(&tlen, bh + PY_BYTES_SIZE, sizeof(tlen));
    if (tlen < 0 || tlen > (int64_t)PY_LINETABLE_MAX)
        tlen = 0;
    uint8_t *table = tlen ? malloc((size_t)tlen) : NULL;
    if (table && !py_read(p, table, lt + PY_BYTES_DATA, (size_t)tlen)) {
        free(table);
        table = NULL;
    }
    free(c->table);
    c->addr = addr;
    c->filename = get64(h, PY_CODE_FILENAME);
    c->qualname = get64(h, PY_CODE_QUALNAME);
    c->linetable = lt;
    memcpy(&c->firstlineno, h + PY_CODE_FIRSTLINENO, sizeof(c->firstlineno));
    c->gen = ++p->py->gen;
    c->table = table;
    c->table_len = table ? (uint32_t)tlen : 0;
    py_set_names(c, name, (size_t)nl, path, (size_t)pl);
    return true;
}

/* The cache slot of the code object at @addr. */
static struct py_code *py_slot(unwinder_process_t *p, uint64_t addr)
{
    return &p->py->codes[(hp_hash_u64(addr) >> 7) & (PY_CODE_SLOTS - 1)];
}

int unwinder_py_code(unwinder_process_t *p, const struct wire_py_code *w, const char *qualname,
                     const char *filename, const uint8_t *linetable)
{
    if (!p->py || w->code == 0)
        return -EINVAL;
    uint8_t *table = NULL;
    if (w->linetable_len) {
        table = malloc(w->linetable_len);
        if (!table)
            return -ENOMEM;
        memcpy(table, linetable, w->linetable_len);
    }
    struct py_code *c = py_slot(p, w->code);
    free(c->table);
    /* The addresses of its strings are not told: an entry filled here is found by its
     * address and check only (py_code()). */
    *c = (struct py_code){.addr = w->code,
                          .firstlineno = w->firstlineno,
                          .check = w->check,
                          .gen = ++p->py->gen,
                          .table = table,
                          .table_len = w->linetable_len};
    py_set_names(c, qualname, w->qualname_len, filename, w->filename_len);
    return 0;
}

/* The cache entry of the code object the client saw at @addr (its wire_py_check()
 * @check): the one kept for that address and check, else the object there now when it
 * is still that one (the entry filled from it); NULL when neither. A kept entry is not
 * read again: the client read the object at the sample (preload/python.c), and an
 * object at the same address with the same file, name and first line (the check's 24
 * bits) is named the same; reading it at every frame of every sample was most of the
 * service's time for a Python program. */
static struct py_code *py_code(unwinder_process_t *p, uint64_t addr, uint32_t check)
{
    uint8_t h[PY_CODE_HEAD];
    struct py_code *c = py_slot(p, addr);
    bool kept = c->addr == addr && c->check == check;
    if (kept)
        return c;
    if (!py_read(p, h, addr, sizeof(h)) || get64(h, PY_OB_TYPE) != p->py->rt.code_type)
        return NULL;
    int32_t first;
    memcpy(&first, h + PY_CODE_FIRSTLINENO, sizeof(first));
    uint64_t file = get64(h, PY_CODE_FILENAME), qual = get64(h, PY_CODE_QUALNAME);
    if (wire_py_check(file, qual, first) != check)
        return NULL; /* another code object at the address now */
    if (c->addr == addr && c->firstlineno == first && c->filename == file && c->qualname == qual &&
        c->linetable == get64(h, PY_CODE_LINETABLE))
        return c;
    if (!py_fill(p, c, addr, h)) {
        c->addr = 0;
        return NULL;
    }
    c->check = check;
    return c;
}

/* The name of frame @f: "qualname (file.py:line)", interned; NULL when unnamed. */
static const char *py_name(unwinder_process_t *p, const struct wire_py_frame *f,
                           const struct hp_mapping **ret_map, int *ret_line)
{
    struct py_code *c = py_code(p, f->code, f->flags >> WIRE_PYF_CHECK_SHIFT);
    if (!c)
        return NULL;
    struct py_name *e =
        &p->py->names[(hp_hash_u64(f->code ^ (uint64_t)(uint32_t)f->instr << 48) >> 5) &
                      (PY_NAME_SLOTS - 1)];
    /* The line too is the entry's: its table is walked once per instruction, not per
     * sample (5% of the service's time on a Python workload otherwise). */
    if (e->code != f->code || e->instr != f->instr || e->gen != c->gen) {
        int line = unwinder_py_line(c->table, c->table_len, c->firstlineno, f->instr);
        char buf[PY_NAME_MAX + 64];
        int k = line > 0 ? snprintf(buf, sizeof(buf), "%s (%s:%d)", c->qualname_s, c->base, line)
                         : snprintf(buf, sizeof(buf), "%s (%s)", c->qualname_s, c->base);
        size_t len = k < 0 ? 0 : HP_MIN((size_t)k, sizeof(buf) - 1);
        *e = (struct py_name){.code = f->code,
                              .instr = f->instr,
                              .gen = c->gen,
                              .name = unwinder__intern(buf, len),
                              .line = line};
    }
    *ret_map = c->map;
    *ret_line = e->line;
    return e->name;
}

/* ---- putting them into the stack --------------------------------------------------- */

/* True for a frame of CPython's evaluation loop (its cold part too). */
static bool is_eval_frame(const struct hp_frame *f)
{
    static const char eval[] = "_PyEval_EvalFrameDefault";
    const char *n = f->function_name;
    return n && strncmp(n, eval, sizeof(eval) - 1) == 0 &&
           (n[sizeof(eval) - 1] == '\0' || n[sizeof(eval) - 1] == '.');
}

/* Writes the frames of Python frames @py[from..to) to @out at *@k (room up to @max). */
static void py_put(unwinder_process_t *p, const struct wire_py_frame *py, size_t from, size_t to,
                   struct hp_frame *out, size_t *k, size_t max, struct unwinder_py_result *res)
{
    for (size_t j = from; j < to && *k < max; j++) {
        const struct hp_mapping *map = NULL;
        int line = 0;
        const char *name = py_name(p, &py[j], &map, &line);
        if (name) {
            out[(*k)++] = (struct hp_frame){
                .map = map, .function_name = name, .rel_pc = line > 0 ? (uint64_t)line : 0};
            res->named++;
        } else {
            out[(*k)++] =
                (struct hp_frame){.function_name = unwinder__intern(
                                      UNWINDER_PY_UNNAMED, sizeof(UNWINDER_PY_UNNAMED) - 1)};
            res->unnamed++;
        }
    }
}

/* Runs of the evaluation loop in @py[0..n): each ends with an ENTRY frame; a last one
 * without is counted too (a stack cut short). */
static size_t py_runs(const struct wire_py_frame *py, size_t n)
{
    size_t runs = 0;
    for (size_t i = 0; i < n; i++)
        if ((py[i].flags & WIRE_PYF_ENTRY) || i + 1 == n)
            runs++;
    return runs;
}

int unwinder_py_merge(unwinder_process_t *p, struct hp_frame *frames, size_t *n, size_t max,
                      const struct wire_py_frame *py, size_t n_py, uint32_t tail_flags,
                      struct unwinder_py_result *ret)
{
    *ret = (struct unwinder_py_result){0};
    if (!p->py || p->py->rt.status != WIRE_PY_OK || n_py == 0 || max > UNWINDER_MAX_FRAMES + 1)
        return 0;
    size_t evals = 0;
    for (size_t i = 0; i < *n; i++)
        evals += is_eval_frame(&frames[i]);
    size_t runs = py_runs(py, n_py);
    bool whole = !(tail_flags & (WIRE_PYT_TRUNCATED | WIRE_PYT_BROKEN)) &&
                 (py[n_py - 1].flags & WIRE_PYF_ENTRY);
    /* Every run of the loop is one evaluation frame in the native stack; a Python stack
     * cut short pairs with the innermost ones only. */
    if (evals == 0 || (whole ? runs != evals : runs > evals)) {
        ret->mismatch = true;
        return 0;
    }
    struct hp_frame *out = p->py->scratch;
    size_t k = 0, next = 0;
    for (size_t i = 0; i < *n && k < max; i++) {
        if (!is_eval_frame(&frames[i]) || next == n_py) {
            out[k++] = frames[i];
            continue;
        }
        size_t end = next;
        while (end < n_py && !(py[end].flags & WIRE_PYF_ENTRY))
            end++;
        end = end < n_py ? end + 1 : n_py;
        py_put(p, py, next, end, out, &k, max, ret);
        next = end;
    }
    memcpy(frames, out, k * sizeof(*out));
    *n = k;
    return 0;
}
