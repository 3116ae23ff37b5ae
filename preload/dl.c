/* preload/dl.c: the exported dlopen and dlclose, which tell the service when code comes
 * and goes (client_dl_event(), preload/hook.c). Not on the allocator's hook path: they run
 * in the application's context, so they may call dlsym to find the real functions (once;
 * glibc's, next after us in the lookup order). */
#include "preload/client.h"

#include <dlfcn.h>
#include <stdatomic.h>
#include <stdint.h>

#include "common/macros.h"
#include "preload/got.h"

typedef void *(*dl_open_fn)(const char *, int);
typedef int (*dl_close_fn)(void *);
static _Atomic(dl_open_fn) dl_real_open;
static _Atomic(dl_close_fn) dl_real_close;

HP_EXPORT void *dlopen(const char *file, int mode)
{
    dl_open_fn real = atomic_load_explicit(&dl_real_open, memory_order_acquire);
    if (!real) {
        real = (dl_open_fn)(uintptr_t)dlsym(RTLD_NEXT, "dlopen");
        if (!real)
            return NULL; /* no dlopen after us: nothing can be loaded */
        atomic_store_explicit(&dl_real_open, real, memory_order_release);
    }
    void *h = real(file, mode);
    if (h)
        client_got_after_dlopen();
    if (h)
        client_dl_event(CLIENT_DL_OPENED);
    return h;
}

HP_EXPORT int dlclose(void *handle)
{
    dl_close_fn real = atomic_load_explicit(&dl_real_close, memory_order_acquire);
    if (!real) {
        real = (dl_close_fn)(uintptr_t)dlsym(RTLD_NEXT, "dlclose");
        if (!real)
            return -1; /* no dlclose after us: nothing could have been loaded */
        atomic_store_explicit(&dl_real_close, real, memory_order_release);
    }
    client_dl_event(CLIENT_DL_CLOSING);
    int r = real(handle);
    client_dl_event(CLIENT_DL_CLOSED);
    return r;
}
