/* preload/dl.c: whether code came or went since the session last looked, from glibc's
 * counters of objects added to and removed from the link maps (dlpi_adds, dlpi_subs of
 * dl_iterate_phdr(3)). They count every load and unload: dlopen, dlmopen into any
 * namespace, glibc's own (NSS, iconv modules), whoever the caller, so nothing needs to
 * be wrapped, and dlopen() keeps finding what the application's own caller would find
 * (DT_RUNPATH, $ORIGIN, namespaces: a wrapper in this library made glibc resolve those
 * for libheapprof.so instead).
 *
 * Hook path, with one exception to the rules: dl_iterate_phdr() takes the loader's
 * recursive dl_load_write_lock for the duration of the call (a few nanoseconds here:
 * the callback reads the first object and stops). No allocation. A thread that holds the
 * lock (the loader adding or removing an object, or another dl_iterate_phdr() caller
 * inside its callback) is waited for; the same thread may hold it already (a malloc from
 * inside the loader or from a callback), which the recursive lock allows. The only way
 * to a deadlock is a callback of the application's that blocks on a lock another thread
 * holds while it allocates: the callback's author would be waiting for a malloc, which
 * the allocator never promised not to take (the loader's own allocations hold it too). */
#include "preload/client.h"

#include <link.h>
#include <stddef.h>

struct dl_counts {
    uint64_t adds, subs;
};

static int dl_counts_cb(struct dl_phdr_info *info, size_t size, void *data)
{
    struct dl_counts *c = data;
    /* dlpi_adds and dlpi_subs came with glibc 2.4; older callers pass a shorter struct. */
    if (size < offsetof(struct dl_phdr_info, dlpi_subs) + sizeof(info->dlpi_subs))
        return -1;
    c->adds = info->dlpi_adds;
    c->subs = info->dlpi_subs;
    return 1;
}

bool client_dl_counts(uint64_t *ret_adds, uint64_t *ret_subs)
{
    struct dl_counts c;
    if (dl_iterate_phdr(dl_counts_cb, &c) != 1)
        return false;
    *ret_adds = c.adds;
    *ret_subs = c.subs;
    return true;
}
