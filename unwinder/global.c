/* unwinder/global.c: the lifetime of the state of unwinder/ shared by all processes and
 * threads: unwinder_global_init() and unwinder_global_done(), reference-counted, which
 * set up and release the interning tables (intern.c), the ELF cache, the source-line
 * cache and the signal-mask override, and unwinder_global_bytes(). Thread-safe.
 */
#include "unwinder/unwinder_internal.h"

#include <pthread.h>
#include <stddef.h>

#include "unwinder/sigmask.h"
#include "unwinder/unwinder.h"

/* Guards the reference count, and so the setup and release of the global state. */
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static unsigned g_refs;

static void free_all_locked(void)
{
    unwinder__srcline_done();
    unwinder__elf_cache_done();
    unwinder__intern_done();
}

int unwinder_global_init(void)
{
    int r = 0;
    pthread_mutex_lock(&g_lock);
    if (g_refs++ > 0)
        goto out;
    r = unwinder__intern_init();
    if (r < 0)
        goto fail;
    r = unwinder__elf_cache_init();
    if (r < 0)
        goto fail;
    unwinder__sigmask_init();
    goto out;
fail:
    g_refs--;
    free_all_locked();
out:
    pthread_mutex_unlock(&g_lock);
    return r;
}

void unwinder_global_done(void)
{
    pthread_mutex_lock(&g_lock);
    if (g_refs > 0 && --g_refs == 0)
        free_all_locked();
    pthread_mutex_unlock(&g_lock);
}

size_t unwinder_global_bytes(void)
{
    return unwinder__intern_bytes();
}
