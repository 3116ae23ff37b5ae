/* common/strtab.c: the thread-safe string interner (strtab.h). */
#include "common/strtab.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/containers.h"

struct entry {
    uint64_t hash;
    const char *str;
    size_t len;
};

struct chunk {
    struct chunk *next;
    size_t used, cap;
    char data[];
};

struct hp_strtab {
    pthread_mutex_t lock;
    struct entry *slots;
    size_t nslots, count;
    struct chunk *chunks;
    size_t bytes;
    uint64_t seed;
};

/* Keyed: the strings are paths and symbol names from the clients' files, which must not
 * be able to pile up in one run of slots (common/containers.h). */
static uint64_t hash_bytes(const hp_strtab_t *t, const char *s, size_t len)
{
    return hp_hash_bytes(s, len, t->seed) | 1; /* 0 marks an empty slot */
}

hp_strtab_t *hp_strtab_new(void)
{
    hp_strtab_t *t = calloc(1, sizeof(*t));
    if (!t)
        return NULL;
    pthread_mutex_init(&t->lock, NULL);
    t->seed = hp_hash_seed();
    t->nslots = 1024;
    t->slots = calloc(t->nslots, sizeof(*t->slots));
    if (!t->slots) {
        free(t);
        return NULL;
    }
    t->bytes = t->nslots * sizeof(*t->slots);
    return t;
}

hp_strtab_t *hp_strtab_free(hp_strtab_t *t)
{
    if (!t)
        return NULL;
    struct chunk *c = t->chunks;
    while (c) {
        struct chunk *n = c->next;
        free(c);
        c = n;
    }
    free(t->slots);
    pthread_mutex_destroy(&t->lock);
    free(t);
    return NULL;
}

static int grow_locked(hp_strtab_t *t)
{
    size_t n = t->nslots * 2;
    struct entry *s = calloc(n, sizeof(*s));
    if (!s)
        return -1;
    for (size_t i = 0; i < t->nslots; i++) {
        if (!t->slots[i].hash)
            continue;
        size_t j = t->slots[i].hash & (n - 1);
        while (s[j].hash)
            j = (j + 1) & (n - 1);
        s[j] = t->slots[i];
    }
    t->bytes += (n - t->nslots) * sizeof(*s);
    free(t->slots);
    t->slots = s;
    t->nslots = n;
    return 0;
}

static char *store_locked(hp_strtab_t *t, const char *s, size_t len)
{
    struct chunk *c = t->chunks;
    if (!c || c->cap - c->used < len + 1) {
        size_t cap = len + 1 > 65536 ? len + 1 : 65536;
        c = malloc(sizeof(*c) + cap);
        if (!c)
            return NULL;
        c->used = 0;
        c->cap = cap;
        c->next = t->chunks;
        t->chunks = c;
        t->bytes += sizeof(*c) + cap;
    }
    char *p = c->data + c->used;
    memcpy(p, s, len);
    p[len] = '\0';
    c->used += len + 1;
    return p;
}

const char *hp_strtab_intern(hp_strtab_t *t, const char *s, size_t len)
{
    uint64_t h = hash_bytes(t, s, len);
    const char *res = NULL;
    pthread_mutex_lock(&t->lock);
    if ((t->count + 1) * 2 > t->nslots && grow_locked(t) < 0)
        goto out;
    size_t i = h & (t->nslots - 1);
    while (t->slots[i].hash) {
        struct entry *e = &t->slots[i];
        if (e->hash == h && e->len == len && memcmp(e->str, s, len) == 0) {
            res = e->str;
            goto out;
        }
        i = (i + 1) & (t->nslots - 1);
    }
    char *p = store_locked(t, s, len);
    if (!p)
        goto out;
    t->slots[i] = (struct entry){.hash = h, .str = p, .len = len};
    t->count++;
    res = p;
out:
    pthread_mutex_unlock(&t->lock);
    return res;
}

size_t hp_strtab_bytes(hp_strtab_t *t)
{
    pthread_mutex_lock(&t->lock);
    size_t b = t->bytes;
    pthread_mutex_unlock(&t->lock);
    return b;
}
