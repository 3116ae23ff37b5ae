/* unwinder/intern.c: the interning state of unwinder/, shared by all processes and
 * threads: the string table that interns paths and function names, the table of
 * interned, immutable struct hp_mapping objects, and the byte count of the global caches.
 * A leaf: it calls nothing else in unwinder/; global.c sets it up and releases it.
 * Thread-safe.
 */
#include "unwinder/unwinder_internal.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/containers.h"
#include "common/strtab.h"

/* Guards the mapping table, and g_strs against its release while its size is read. The
 * string table has its own lock. */
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static hp_strtab_t *g_strs;
static const char *g_empty;

/* Open addressing, linear probing, power-of-two size, at most half full. Keyed by
 * g_maps_seed: the mappings' addresses, offsets and paths are the clients' choice. */
static const struct hp_mapping **g_maps;
static size_t g_maps_cap, g_maps_n;
static uint64_t g_maps_seed;

/* Heap bytes of the ELF cache and the mapping table (the string table counts itself).
 * Relaxed: a statistic, no memory is published through it. */
static atomic_size_t g_bytes;

void unwinder__account(ssize_t delta)
{
    if (delta >= 0)
        atomic_fetch_add_explicit(&g_bytes, (size_t)delta, memory_order_relaxed);
    else
        atomic_fetch_sub_explicit(&g_bytes, (size_t)-delta, memory_order_relaxed);
}

const char *unwinder__empty(void)
{
    return g_empty;
}

const char *unwinder__intern(const char *s, size_t len)
{
    const char *r = hp_strtab_intern(g_strs, s, len);
    return r ? r : g_empty;
}

static uint64_t mapping_hash(const struct hp_mapping *m)
{
    uint64_t h = hp_hash_keyed(g_maps_seed, (uint64_t)(uintptr_t)m->path);
    h = hp_hash_keyed2(h, m->start, m->end);
    h = hp_hash_keyed2(h, m->exact_offset, m->start_offset);
    h = hp_hash_keyed2(h, m->load_bias, m->build_id_len);
    uint32_t n = HP_MIN(m->build_id_len, (uint32_t)HP_BUILD_ID_MAX);
    return hp_hash_bytes(m->build_id, n, h);
}

static bool mapping_eq(const struct hp_mapping *a, const struct hp_mapping *b)
{
    return a->start == b->start && a->end == b->end && a->exact_offset == b->exact_offset &&
           a->start_offset == b->start_offset && a->load_bias == b->load_bias &&
           a->path == b->path && a->build_id_len == b->build_id_len &&
           memcmp(a->build_id, b->build_id, a->build_id_len) == 0;
}

static int maps_grow_locked(void)
{
    size_t ncap = g_maps_cap ? g_maps_cap * 2 : 256;
    const struct hp_mapping **nv = calloc(ncap, sizeof(*nv));
    if (!nv)
        return -ENOMEM;
    for (size_t i = 0; i < g_maps_cap; i++) {
        if (!g_maps[i])
            continue;
        size_t j = mapping_hash(g_maps[i]) & (ncap - 1);
        while (nv[j])
            j = (j + 1) & (ncap - 1);
        nv[j] = g_maps[i];
    }
    unwinder__account((ssize_t)((ncap - g_maps_cap) * sizeof(*nv)));
    free(g_maps);
    g_maps = nv;
    g_maps_cap = ncap;
    return 0;
}

const struct hp_mapping *unwinder__mapping_intern(const struct hp_mapping *tmpl)
{
    struct hp_mapping key = *tmpl;
    if (key.build_id_len > HP_BUILD_ID_MAX)
        key.build_id_len = HP_BUILD_ID_MAX;
    memset(key.build_id + key.build_id_len, 0, HP_BUILD_ID_MAX - key.build_id_len);
    uint64_t h = mapping_hash(&key);

    const struct hp_mapping *res = NULL;
    pthread_mutex_lock(&g_lock);
    if ((g_maps_n + 1) * 2 > g_maps_cap && maps_grow_locked() < 0)
        goto out;
    size_t i = h & (g_maps_cap - 1);
    while (g_maps[i]) {
        if (mapping_eq(g_maps[i], &key)) {
            res = g_maps[i];
            goto out;
        }
        i = (i + 1) & (g_maps_cap - 1);
    }
    struct hp_mapping *m = malloc(sizeof(*m));
    if (!m)
        goto out;
    *m = key;
    g_maps[i] = m;
    g_maps_n++;
    unwinder__account(sizeof(*m));
    res = m;
out:
    pthread_mutex_unlock(&g_lock);
    return res;
}

int unwinder__intern_init(void)
{
    pthread_mutex_lock(&g_lock);
    g_maps_seed = hp_hash_seed();
    g_strs = hp_strtab_new();
    g_empty = g_strs ? hp_strtab_intern(g_strs, "", 0) : NULL;
    pthread_mutex_unlock(&g_lock);
    return g_empty ? 0 : -ENOMEM;
}

void unwinder__intern_done(void)
{
    pthread_mutex_lock(&g_lock);
    for (size_t i = 0; i < g_maps_cap; i++)
        free((void *)g_maps[i]);
    free(g_maps);
    g_maps = NULL;
    g_maps_cap = g_maps_n = 0;
    g_strs = hp_strtab_free(g_strs);
    g_empty = NULL;
    atomic_store_explicit(&g_bytes, 0, memory_order_relaxed);
    pthread_mutex_unlock(&g_lock);
}

size_t unwinder__intern_bytes(void)
{
    size_t b = atomic_load_explicit(&g_bytes, memory_order_relaxed);
    pthread_mutex_lock(&g_lock);
    if (g_strs)
        b += hp_strtab_bytes(g_strs);
    pthread_mutex_unlock(&g_lock);
    return b;
}
