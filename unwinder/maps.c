/* unwinder/maps.c: the /proc/PID/maps parser (maps.h), and the test for the loader's path. */
#include "unwinder/maps.h"

#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/macros.h"

/* A cursor over one line; @end is the line's end (its '\n' or the end of the text). */
struct cur {
    const char *p;
    const char *end;
};

/* At least one and at most 16 hex digits (no overflow possible then). */
static bool take_hex(struct cur *c, uint64_t *ret)
{
    uint64_t v = 0;
    unsigned nd = 0;
    int d;
    while (c->p < c->end && (d = hp_hex_digit(*c->p)) >= 0) {
        if (nd == 16)
            return false;
        v = (v << 4) | (uint64_t)d;
        nd++;
        c->p++;
    }
    if (nd == 0)
        return false;
    *ret = v;
    return true;
}

static bool take_dec(struct cur *c, uint64_t *ret)
{
    uint64_t v = 0;
    unsigned nd = 0;
    while (c->p < c->end && *c->p >= '0' && *c->p <= '9') {
        uint64_t d = (uint64_t)(*c->p - '0');
        if (v > (UINT64_MAX - d) / 10)
            return false;
        v = v * 10 + d;
        nd++;
        c->p++;
    }
    if (nd == 0)
        return false;
    *ret = v;
    return true;
}

static bool take_char(struct cur *c, char ch)
{
    if (c->p >= c->end || *c->p != ch)
        return false;
    c->p++;
    return true;
}

static bool take_perms(struct cur *c, uint32_t *ret)
{
    if (c->end - c->p < 4)
        return false;
    const char *s = c->p;
    uint32_t perms = 0;
    if (s[0] == 'r')
        perms |= UNWINDER_PERM_READ;
    else if (s[0] != '-')
        return false;
    if (s[1] == 'w')
        perms |= UNWINDER_PERM_WRITE;
    else if (s[1] != '-')
        return false;
    if (s[2] == 'x')
        perms |= UNWINDER_PERM_EXEC;
    else if (s[2] != '-')
        return false;
    if (s[3] == 's')
        perms |= UNWINDER_PERM_SHARED;
    else if (s[3] != 'p')
        return false;
    c->p += 4;
    *ret = perms;
    return true;
}

/* Parses one line [line, end). The path is left pointing into the line; the caller has
 * replaced the line's '\n' by a NUL. */
static bool parse_line(const char *line, const char *end, struct unwinder__map *ret)
{
    struct cur c = {.p = line, .end = end};
    struct unwinder__map m = {0};
    uint64_t major, minor;
    if (!take_hex(&c, &m.start) || !take_char(&c, '-') || !take_hex(&c, &m.end) ||
        !take_char(&c, ' ') || !take_perms(&c, &m.perms) || !take_char(&c, ' ') ||
        !take_hex(&c, &m.pgoff) || !take_char(&c, ' ') || !take_hex(&c, &major) ||
        !take_char(&c, ':') || !take_hex(&c, &minor) || !take_char(&c, ' ') ||
        !take_dec(&c, &m.inode))
        return false;
    if (m.start >= m.end || major > UINT32_MAX || minor > UINT32_MAX)
        return false;
    m.dev_major = (uint32_t)major;
    m.dev_minor = (uint32_t)minor;
    if (c.p < c.end) {
        /* The kernel pads with spaces up to the path column. */
        if (*c.p != ' ')
            return false;
        while (c.p < c.end && *c.p == ' ')
            c.p++;
    }
    m.path = c.p;
    /* A NUL inside the line ends the path early; strnlen keeps the length honest. */
    size_t len = strnlen(c.p, (size_t)(c.end - c.p));
    if (len > UINT32_MAX)
        return false;
    m.path_len = (uint32_t)len;
    *ret = m;
    return true;
}

static int cmp_start(const void *a, const void *b)
{
    const struct unwinder__map *x = a, *y = b;
    return x->start < y->start ? -1 : x->start > y->start;
}

/* Takes ownership of @text (@len bytes, with room for one more byte at text[len]). */
static int parse_owned(char *text, size_t len, struct unwinder__maps *ret)
{
    struct unwinder__maps m = {.text = text};
    size_t cap = 0;
    text[len] = '\0';
    char *p = text, *end = text + len;
    while (p < end) {
        char *eol = memchr(p, '\n', (size_t)(end - p));
        if (!eol)
            eol = end;
        *eol = '\0';
        struct unwinder__map e;
        if (eol == p) {
            /* empty line: nothing to count */
        } else if (parse_line(p, eol, &e)) {
            if (m.n == cap) {
                size_t ncap = cap ? cap * 2 : 64;
                struct unwinder__map *nv = realloc(m.v, ncap * sizeof(*nv));
                if (!nv) {
                    unwinder__maps_done(&m);
                    return -ENOMEM;
                }
                m.v = nv;
                cap = ncap;
            }
            m.v[m.n++] = e;
        } else {
            m.bad_lines++;
        }
        p = eol + 1;
    }

    /* The kernel's output is sorted and disjoint; anything else is forced into that shape
     * so that unwinder__maps_find() can binary-search. */
    bool sorted = true;
    for (size_t i = 1; i < m.n && sorted; i++)
        sorted = m.v[i - 1].start <= m.v[i].start;
    if (!sorted)
        qsort(m.v, m.n, sizeof(*m.v), cmp_start);
    size_t out = 0;
    for (size_t i = 0; i < m.n; i++) {
        if (out > 0 && m.v[i].start < m.v[out - 1].end) {
            m.bad_lines++;
            continue;
        }
        m.v[out++] = m.v[i];
    }
    m.n = out;
    *ret = m;
    return 0;
}

int unwinder__maps_parse(const char *text, size_t len, struct unwinder__maps *ret)
{
    if (len > UNWINDER_MAPS_MAX_BYTES)
        return -EFBIG;
    char *copy = malloc(len + 1);
    if (!copy)
        return -ENOMEM;
    if (len)
        memcpy(copy, text, len);
    return parse_owned(copy, len, ret);
}

int unwinder__maps_read(int fd, struct unwinder__maps *ret)
{
    size_t cap = 64 * 1024, off = 0;
    char *buf = malloc(cap + 1);
    if (!buf)
        return -ENOMEM;
    for (;;) {
        if (off == cap) {
            if (cap >= UNWINDER_MAPS_MAX_BYTES) {
                free(buf);
                return -EFBIG;
            }
            size_t ncap = HP_MIN(cap * 2, (size_t)UNWINDER_MAPS_MAX_BYTES);
            char *nb = realloc(buf, ncap + 1);
            if (!nb) {
                free(buf);
                return -ENOMEM;
            }
            buf = nb;
            cap = ncap;
        }
        ssize_t n = pread(fd, buf + off, cap - off, (off_t)off);
        if (n < 0) {
            int r = -errno;
            if (r == -EINTR)
                continue;
            free(buf);
            return r;
        }
        if (n == 0)
            break;
        off += (size_t)n;
    }
    return parse_owned(buf, off, ret);
}

void unwinder__maps_done(struct unwinder__maps *m)
{
    if (!m)
        return;
    free(m->v);
    free(m->text);
    *m = (struct unwinder__maps){0};
}

ssize_t unwinder__maps_find(const struct unwinder__maps *m, uint64_t addr)
{
    size_t lo = 0, hi = m->n;
    /* Last mapping with start <= addr. */
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (m->v[mid].start <= addr)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo == 0)
        return -1;
    const struct unwinder__map *e = &m->v[lo - 1];
    return addr < e->end ? (ssize_t)(lo - 1) : -1;
}

bool unwinder__is_loader_path(const char *path)
{
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    return strncmp(base, "ld-linux", 8) == 0 || strncmp(base, "ld.so", 5) == 0;
}
