/* producer/smb.c: the shared memory buffer's ABI: mapping, page words and chunk states
 * (the diagram in producer_internal.h), and the queue of completed chunks waiting for a
 * commit. Every page word update is a 32-bit compare-and-swap: traced frees chunks of
 * the same pages concurrently and aborts on a state it does not expect. */
#include "producer/producer_internal.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <unistd.h>

#include "common/containers.h"

const uint8_t prod__layout_chunks[8] = {0, 1, 2, 4, 7, 14, 0, 0};

size_t prod__chunk_size(size_t page_size, unsigned layout)
{
    unsigned n = prod__layout_chunks[layout & 7];
    if (n == 0)
        return 0;
    return ((page_size - PROD_PAGE_HEADER_BYTES) / n) & ~(size_t)3;
}

int prod__smb_new(int fd, size_t size, size_t page_size, struct prod__smb **ret)
{
    if (page_size < PROD_MIN_PAGE_BYTES || page_size > PROD_MAX_PAGE_BYTES ||
        (page_size & (page_size - 1)) || size < page_size || size % page_size ||
        size > PROD_MAX_SMB_BYTES)
        return -EINVAL;
    struct prod__smb *s = calloc(1, sizeof(*s));
    if (!s)
        return -ENOMEM;
    s->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (s->wake_fd < 0) {
        int r = -errno;
        free(s);
        return r;
    }
    void *m = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED) {
        int r = -errno;
        (void)close(s->wake_fd);
        free(s);
        return r;
    }
    atomic_init(&s->refs, 1);
    atomic_init(&s->next_page, 0);
    s->base = m;
    s->size = size;
    s->page_size = page_size;
    s->n_pages = size / page_size;
    s->commit_batch = HP_MAX(s->n_pages / 4, (size_t)1);
    pthread_mutex_init(&s->lock, NULL);
    pthread_cond_init(&s->freed, NULL);
    *ret = s;
    return 0;
}

struct prod__smb *prod__smb_ref(struct prod__smb *s)
{
    atomic_fetch_add_explicit(&s->refs, 1, memory_order_relaxed);
    return s;
}

struct prod__smb *prod__smb_unref(struct prod__smb *s)
{
    /* acq_rel: the last one sees every other holder's writes before unmapping. */
    if (!s || atomic_fetch_sub_explicit(&s->refs, 1, memory_order_acq_rel) != 1)
        return NULL;
    (void)munmap(s->base, s->size);
    (void)close(s->wake_fd);
    free(s->moves);
    pthread_cond_destroy(&s->freed);
    pthread_mutex_destroy(&s->lock);
    free(s);
    return NULL;
}

void prod__smb_kill(struct prod__smb *s)
{
    pthread_mutex_lock(&s->lock);
    s->dead = true;
    s->n_moves = 0;
    pthread_cond_broadcast(&s->freed);
    pthread_mutex_unlock(&s->lock);
}

void prod__smb_chunks_freed(struct prod__smb *s)
{
    pthread_mutex_lock(&s->lock);
    s->freed_gen++;
    pthread_cond_broadcast(&s->freed);
    pthread_mutex_unlock(&s->lock);
}

static inline unsigned chunk_state(uint32_t word, unsigned chunk)
{
    return (word >> (2 * chunk)) & 3u;
}

static inline uint32_t with_state(uint32_t word, unsigned chunk, unsigned state)
{
    return (word & ~(3u << (2 * chunk))) | (uint32_t)state << (2 * chunk);
}

/* Tries page @page: partitions it when free, else takes a free chunk. */
static bool try_page(struct prod__smb *s, size_t page, uint32_t *ret_chunk, unsigned *ret_layout)
{
    uint32_t *w = prod__page_word(s, page);
    uint32_t old = __atomic_load_n(w, __ATOMIC_ACQUIRE);
    for (;;) {
        uint32_t new;
        unsigned chunk = 0;
        unsigned layout = (old >> PROD_LAYOUT_SHIFT) & 7u;
        if (old == 0) {
            /* Partition and take chunk 0 in one step: Div1, as Perfetto's writer. */
            layout = PROD_LAYOUT_DIV1;
            new = layout << PROD_LAYOUT_SHIFT | PROD_CHUNK_BEING_WRITTEN;
        } else {
            unsigned n = prod__layout_chunks[layout];
            while (chunk < n && chunk_state(old, chunk) != PROD_CHUNK_FREE)
                chunk++;
            if (chunk >= n)
                return false;
            new = with_state(old, chunk, PROD_CHUNK_BEING_WRITTEN);
        }
        /* acquire: traced's clearing of the chunk header happened before it freed it. */
        if (__atomic_compare_exchange_n(w, &old, new, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
            *ret_chunk = chunk;
            *ret_layout = layout;
            return true;
        }
        /* Changed under us (traced freed a chunk, or another writer took one): retry
         * with the new word. */
    }
}

int prod__smb_try_acquire(struct prod__smb *s, uint32_t *ret_page, uint32_t *ret_chunk,
                          uint8_t **ret_start, size_t *ret_size)
{
    size_t start = atomic_load_explicit(&s->next_page, memory_order_relaxed) % s->n_pages;
    for (size_t i = 0; i < s->n_pages; i++) {
        size_t page = (start + i) % s->n_pages;
        uint32_t chunk;
        unsigned layout;
        if (!try_page(s, page, &chunk, &layout))
            continue;
        atomic_store_explicit(&s->next_page, (unsigned)((page + 1) % s->n_pages),
                              memory_order_relaxed);
        size_t csize = prod__chunk_size(s->page_size, layout);
        *ret_page = (uint32_t)page;
        *ret_chunk = chunk;
        *ret_start = s->base + page * s->page_size + PROD_PAGE_HEADER_BYTES + chunk * csize;
        *ret_size = csize;
        return 0;
    }
    return -ENOBUFS;
}

void prod__smb_complete(struct prod__smb *s, uint32_t page, uint32_t chunk)
{
    uint32_t *w = prod__page_word(s, page);
    uint32_t old = __atomic_load_n(w, __ATOMIC_RELAXED);
    /* release: the chunk's bytes and header are visible to traced before the state. */
    while (!__atomic_compare_exchange_n(w, &old, with_state(old, chunk, PROD_CHUNK_COMPLETE), false,
                                        __ATOMIC_RELEASE, __ATOMIC_RELAXED))
        ;
}

static void wake(int fd)
{
    uint64_t one = 1;
    (void)!write(fd, &one, sizeof(one));
}

void prod__smb_wake(struct prod__smb *s)
{
    wake(s->wake_fd);
}

void prod__smb_queue_move(struct prod__smb *s, const struct prod__move *m)
{
    pthread_mutex_lock(&s->lock);
    if (!s->dead) {
        /* Out of memory: the chunk stays Complete and unread, as if the commit were lost;
         * the sequence stops at its id (traced reports it as chunks not read). */
        if (hp_grow((void **)&s->moves, &s->cap_moves, s->n_moves + 1, sizeof(*s->moves)) == 0)
            s->moves[s->n_moves++] = *m;
    }
    /* One wake-up per batch of a quarter of the SMB: the owner takes every queued move
     * at once, and a wake-up per chunk cost more than the copy (4 KiB pages, bench:
     * producer_dump_vs_file_ratio). Fewer stay queued until a writer runs short of
     * chunks, finishes or flushes, which wake the owner themselves. */
    bool batch = s->n_moves == s->commit_batch;
    pthread_mutex_unlock(&s->lock);
    if (batch)
        wake(s->wake_fd);
}

size_t prod__smb_take_moves(struct prod__smb *s, struct prod__move **ret)
{
    pthread_mutex_lock(&s->lock);
    size_t n = s->n_moves;
    *ret = NULL;
    if (n) {
        *ret = s->moves;
        s->moves = NULL;
        s->n_moves = s->cap_moves = 0;
    }
    pthread_mutex_unlock(&s->lock);
    return n;
}

bool prod__smb_take_starved(struct prod__smb *s)
{
    pthread_mutex_lock(&s->lock);
    bool st = s->starved;
    s->starved = false;
    pthread_mutex_unlock(&s->lock);
    return st;
}
