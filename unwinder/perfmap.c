/* unwinder/perfmap.c: names of JIT-compiled functions from the runtime's perf map,
 * /tmp/perf-PID.map, which node (--perf-basic-prof), JVM agents, LuaJIT and others write
 * as they compile code: one line per function,
 *
 *     START SIZE name        START and SIZE in hex (with or without 0x), name to the end
 *
 * The file grows while the process runs, and a line may describe code at addresses an
 * earlier line gave to other code since freed: the later line wins there. It is read
 * from where the last read stopped whenever a pc in JIT code has no name (at most every
 * PERFMAP_RETRY_NS, so that a runtime without a perf map costs little), so that names
 * come at the time of the sample, not only at exit.
 *
 * The file belongs to the profiled program and is untrusted: it is opened in the
 * program's own root (openat2's RESOLVE_IN_ROOT on /proc/PID/root, so that no symlink
 * leads out of it), only when it is a regular file of the program's owner; lines are
 * parsed defensively (unwinder__perfmap_parse_line(), fuzzed), and what is kept is
 * bounded (PERFMAP_MAX_ENTRIES functions, PERFMAP_MAX_NAME_BYTES of names): past that,
 * the rest of the file is not read.
 *
 * What is kept: the functions as disjoint ranges sorted by start, each with its name in
 * an arena and the number of its line; a read merges its lines in with a sweep over
 * starts that keeps, at each address, the range of the latest line.
 */
#include "unwinder/unwinder_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/openat2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/macros.h"
#include "common/procfs.h"

#define PERFMAP_MAX_ENTRIES (256u << 10)
#define PERFMAP_MAX_NAME_BYTES (16u << 20)
/* Bytes read per pass at most: a huge file is taken in over several misses. */
#define PERFMAP_READ_MAX (4u << 20)
#define PERFMAP_CHUNK (64u << 10)
/* A miss reads the file again at most this often. */
#define PERFMAP_RETRY_NS (10ull * 1000 * 1000)
/* With no file yet, opening it is tried again at most this often. */
#define PERFMAP_REOPEN_NS (1000ull * 1000 * 1000)

struct pm_range {
    uint64_t start, end;
    uint32_t seq; /* line number: the later line wins */
    uint32_t name_off, name_len;
};

struct unwinder__perfmap {
    int fd;             /* -1 until opened */
    uint64_t off;       /* file offset of the first line not read yet */
    uint64_t tried_ns;  /* last read or open attempt */
    uint32_t next_seq;  /* lines taken so far + 1 */
    bool full;          /* a bound was reached: read no more */
    struct pm_range *v; /* sorted by start, disjoint */
    size_t n;
    char *names; /* arena */
    size_t names_len, names_cap;
};

/* A hex number at s[*i..len) (0x allowed), at most 16 digits. */
static bool parse_hex(const char *s, size_t len, size_t *i, uint64_t *ret)
{
    size_t k = *i;
    if (k + 1 < len && s[k] == '0' && (s[k + 1] == 'x' || s[k + 1] == 'X'))
        k += 2;
    uint64_t v = 0;
    size_t digits = 0;
    for (; k < len && hp_hex_digit(s[k]) >= 0; k++, digits++) {
        if (digits == 16)
            return false;
        v = v << 4 | (uint64_t)hp_hex_digit(s[k]);
    }
    if (digits == 0)
        return false;
    *i = k;
    *ret = v;
    return true;
}

int unwinder__perfmap_parse_line(const char *line, size_t len, uint64_t *ret_start,
                                 uint64_t *ret_size, size_t *ret_name_off, size_t *ret_name_len)
{
    size_t i = 0;
    uint64_t start, size;
    if (!parse_hex(line, len, &i, &start) || i >= len || line[i] != ' ')
        return -EINVAL;
    i++;
    if (!parse_hex(line, len, &i, &size) || i >= len || line[i] != ' ')
        return -EINVAL;
    i++;
    if (size == 0 || start + size < start || i >= len)
        return -EINVAL;
    size_t name_len = len - i;
    if (name_len > UNWINDER_PERFMAP_MAX_NAME)
        name_len = UNWINDER_PERFMAP_MAX_NAME;
    for (size_t k = 0; k < name_len; k++)
        if (line[i + k] == '\0')
            return -EINVAL;
    *ret_start = start;
    *ret_size = size;
    *ret_name_off = i;
    *ret_name_len = name_len;
    return 0;
}

/* ---- merging ----------------------------------------------------------------- */

static int cmp_start(const void *a, const void *b)
{
    const struct pm_range *x = a, *y = b;
    if (x->start != y->start)
        return x->start < y->start ? -1 : 1;
    return x->seq < y->seq ? -1 : x->seq > y->seq;
}

/* A max-heap of ranges by seq. */
static void heap_push(const struct pm_range **h, size_t *n, const struct pm_range *r)
{
    size_t i = (*n)++;
    while (i > 0 && h[(i - 1) / 2]->seq < r->seq) {
        h[i] = h[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    h[i] = r;
}

static void heap_pop(const struct pm_range **h, size_t *n)
{
    const struct pm_range *last = h[--(*n)];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n)
            break;
        if (c + 1 < *n && h[c + 1]->seq > h[c]->seq)
            c++;
        if (h[c]->seq <= last->seq)
            break;
        h[i] = h[c];
        i = c;
    }
    if (*n)
        h[i] = last;
}

/* The disjoint pieces of @v (@n ranges sorted by cmp_start) where each address has the
 * range of the highest seq covering it, written to @out (room for 2n). Returns how many. */
static size_t paint(const struct pm_range *v, size_t n, const struct pm_range **heap,
                    struct pm_range *out)
{
    size_t i = 0, nh = 0, k = 0;
    uint64_t pos = 0;
    while (i < n || nh > 0) {
        if (nh == 0 && pos < v[i].start)
            pos = v[i].start;
        while (i < n && v[i].start <= pos)
            heap_push(heap, &nh, &v[i++]);
        while (nh > 0 && heap[0]->end <= pos)
            heap_pop(heap, &nh);
        if (nh == 0)
            continue;
        const struct pm_range *top = heap[0];
        uint64_t next = top->end;
        if (i < n && v[i].start < next)
            next = v[i].start;
        if (k > 0 && out[k - 1].end == pos && out[k - 1].seq == top->seq) {
            out[k - 1].end = next;
        } else {
            out[k] = *top;
            out[k].start = pos;
            out[k].end = next;
            k++;
        }
        pos = next;
    }
    return k;
}

/* Merges @add (@n_add new ranges, later than every kept one) into @pm. 0 or -ENOMEM. */
static int merge(struct unwinder__perfmap *pm, const struct pm_range *add, size_t n_add)
{
    size_t n = pm->n + n_add;
    struct pm_range *all = malloc(n * sizeof(*all));
    struct pm_range *out = malloc(2 * n * sizeof(*out));
    const struct pm_range **heap = malloc(n * sizeof(*heap));
    if (!all || !out || !heap) {
        free(all);
        free(out);
        free(heap);
        return -ENOMEM;
    }
    if (pm->n)
        memcpy(all, pm->v, pm->n * sizeof(*all));
    memcpy(all + pm->n, add, n_add * sizeof(*all));
    qsort(all, n, sizeof(*all), cmp_start);
    size_t k = paint(all, n, heap, out);
    free(all);
    free(heap);
    struct pm_range *shrunk = realloc(out, (k ? k : 1) * sizeof(*out));
    free(pm->v);
    pm->v = shrunk ? shrunk : out;
    pm->n = k;
    return 0;
}

/* ---- reading ----------------------------------------------------------------- */

static int name_append(struct unwinder__perfmap *pm, const char *s, size_t len, uint32_t *ret_off)
{
    if (pm->names_len + len > PERFMAP_MAX_NAME_BYTES)
        return -ENOSPC;
    if (pm->names_len + len > pm->names_cap) {
        size_t cap = pm->names_cap ? pm->names_cap * 2 : 4096;
        while (cap < pm->names_len + len)
            cap *= 2;
        char *p = realloc(pm->names, cap);
        if (!p)
            return -ENOMEM;
        pm->names = p;
        pm->names_cap = cap;
    }
    memcpy(pm->names + pm->names_len, s, len);
    *ret_off = (uint32_t)pm->names_len;
    pm->names_len += len;
    return 0;
}

/* Takes the complete lines of @buf[0..len) into @add (room for *n_add + len / 6 more):
 * returns the bytes consumed (up to the end of the last complete line). A line longer
 * than a chunk is skipped by the caller. */
static size_t take_lines(struct unwinder__perfmap *pm, const char *buf, size_t len,
                         struct pm_range *add, size_t *n_add)
{
    size_t used = 0;
    while (used < len && !pm->full) {
        const char *nl = memchr(buf + used, '\n', len - used);
        if (!nl)
            break;
        size_t line_len = (size_t)(nl - (buf + used));
        uint64_t start, size;
        size_t name_off, name_len;
        uint32_t off;
        if (unwinder__perfmap_parse_line(buf + used, line_len, &start, &size, &name_off,
                                         &name_len) == 0) {
            if (pm->n + *n_add >= PERFMAP_MAX_ENTRIES ||
                name_append(pm, buf + used + name_off, name_len, &off) < 0) {
                pm->full = true;
                break;
            }
            add[(*n_add)++] = (struct pm_range){.start = start,
                                                .end = start + size,
                                                .seq = pm->next_seq++,
                                                .name_off = off,
                                                .name_len = (uint32_t)name_len};
        }
        used += line_len + 1;
    }
    return used;
}

bool unwinder__perfmap_read(struct unwinder__perfmap *pm)
{
    if (pm->fd < 0)
        return false;
    char *chunk = malloc(PERFMAP_CHUNK);
    /* Up to a line per 6 bytes ("1 1 x\n"). */
    struct pm_range *add = malloc((PERFMAP_CHUNK / 6 + 1) * sizeof(*add));
    bool any = false;
    size_t total = 0;
    while (chunk && add && !pm->full && total < PERFMAP_READ_MAX) {
        ssize_t r = pread(pm->fd, chunk, PERFMAP_CHUNK, (off_t)pm->off);
        if (r <= 0)
            break;
        size_t n_add = 0;
        size_t used = take_lines(pm, chunk, (size_t)r, add, &n_add);
        if (used == 0 && (size_t)r == PERFMAP_CHUNK) {
            /* A line longer than a chunk: not a perf map line; skip to its end. */
            used = (size_t)r;
        }
        if (n_add) {
            if (merge(pm, add, n_add) < 0) {
                pm->full = true;
                break;
            }
            any = true;
        }
        pm->off += used;
        total += used;
        if (used < (size_t)r || (size_t)r < PERFMAP_CHUNK)
            break; /* a partial last line, or the end */
    }
    free(chunk);
    free(add);
    return any;
}

/* Opens the perf map of @pid (the file named after @nspid, its pid in its own pid
 * namespace) within its root: -errno, or the fd. */
static int perfmap_open(pid_t pid, pid_t nspid)
{
    char root[64], rel[64];
    snprintf(root, sizeof(root), "/proc/%d/root", (int)pid);
    snprintf(rel, sizeof(rel), "tmp/perf-%d.map", (int)nspid);
    int dfd = open(root, O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0)
        return -errno;
    struct stat owner;
    char proc[32];
    snprintf(proc, sizeof(proc), "/proc/%d", (int)pid);
    if (stat(proc, &owner) < 0) {
        int e = -errno;
        (void)close(dfd);
        return e;
    }
    struct open_how how = {
        .flags = O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC,
        .resolve = RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV,
    };
    int fd = (int)syscall(SYS_openat2, dfd, rel, &how, sizeof(how));
    int e = fd < 0 ? -errno : 0;
    (void)close(dfd);
    if (fd < 0)
        return e;
    struct stat st;
    if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) || st.st_uid != owner.st_uid) {
        (void)close(fd);
        return -EPERM;
    }
    return fd;
}

struct unwinder__perfmap *unwinder__perfmap_new(int fd)
{
    struct unwinder__perfmap *pm = calloc(1, sizeof(*pm));
    if (!pm) {
        if (fd >= 0)
            (void)close(fd);
        return NULL;
    }
    pm->fd = fd;
    pm->next_seq = 1;
    return pm;
}

const char *unwinder__perfmap_lookup(const struct unwinder__perfmap *pm, uint64_t pc,
                                     size_t *ret_len)
{
    /* The last range starting at or below pc. */
    size_t lo = 0, hi = pm->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (pm->v[mid].start <= pc)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo == 0 || pc >= pm->v[lo - 1].end)
        return NULL;
    *ret_len = pm->v[lo - 1].name_len;
    return pm->names + pm->v[lo - 1].name_off;
}

bool unwinder__perfmap_valid(const struct unwinder__perfmap *pm)
{
    for (size_t i = 0; i < pm->n; i++) {
        const struct pm_range *r = &pm->v[i];
        if (r->start >= r->end || (i > 0 && pm->v[i - 1].end > r->start) ||
            (uint64_t)r->name_off + r->name_len > pm->names_len)
            return false;
    }
    return pm->n <= PERFMAP_MAX_ENTRIES && pm->names_len <= PERFMAP_MAX_NAME_BYTES;
}

struct unwinder__perfmap *unwinder__perfmap_free(struct unwinder__perfmap *pm)
{
    if (!pm)
        return NULL;
    if (pm->fd >= 0)
        (void)close(pm->fd);
    free(pm->v);
    free(pm->names);
    free(pm);
    return NULL;
}

const char *unwinder__perfmap_name(struct unwinder_process *p, uint64_t pc, bool *ret_read)
{
    *ret_read = false;
    if (!p->perfmap && !(p->perfmap = unwinder__perfmap_new(-1)))
        return NULL;
    struct unwinder__perfmap *pm = p->perfmap;
    for (int pass = 0;; pass++) {
        size_t len;
        const char *name = unwinder__perfmap_lookup(pm, pc, &len);
        if (name)
            return unwinder__intern(name, len);
        if (pass > 0 || pm->full)
            return NULL;
        uint64_t now = hp_clock_ns(CLOCK_MONOTONIC);
        if (pm->tried_ns &&
            now - pm->tried_ns < (pm->fd < 0 ? PERFMAP_REOPEN_NS : PERFMAP_RETRY_NS))
            return NULL;
        pm->tried_ns = now ? now : 1;
        if (pm->fd < 0) {
            int fd = perfmap_open(p->pid, hp_proc_ns_pid(p->pid));
            if (fd < 0)
                return NULL;
            pm->fd = fd;
        }
        if (!unwinder__perfmap_read(pm))
            return NULL;
        *ret_read = true;
    }
}
