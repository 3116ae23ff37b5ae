/* tests/programs/harm/plugins/plug.c: the plugin the plugin loaders load (plugins.c). It
 * allocates, and loads a helper library of its own through its own DT_RUNPATH
 * ($ORIGIN), to say which namespace that lands in. */
#include <dlfcn.h>
#include <link.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

__attribute__((visibility("default"))) unsigned long plug_work(int rounds);
__attribute__((visibility("default"))) int plug_same_namespace(void);

__attribute__((visibility("default"), noinline)) unsigned long plug_work(int rounds)
{
    unsigned long s = 0;
    for (int i = 0; i < rounds; i++) {
        size_t n = 100 + (size_t)(i % 50) * 100;
        unsigned char *p = malloc(n);
        if (!p)
            abort();
        memset(p, i, n);
        s += p[n - 1];
        free(p);
    }
    return s;
}

/* 1 when the helper loaded from here is in this plugin's namespace, 0 when not, -1 when
 * it did not load. */
__attribute__((visibility("default"))) int plug_same_namespace(void)
{
    void *h = dlopen("libharm_helper.so", RTLD_NOW | RTLD_LOCAL);
    if (!h)
        return -1;
    Lmid_t mine = -1, its = -2;
    Dl_info info;
    struct link_map *lm = NULL;
    if (dladdr1((void *)plug_same_namespace, &info, (void **)&lm, RTLD_DL_LINKMAP) == 0 ||
        dlinfo(h, RTLD_DI_LMID, &its) != 0)
        return -1;
    void *self = dlopen(info.dli_fname, RTLD_NOW | RTLD_NOLOAD);
    if (!self || dlinfo(self, RTLD_DI_LMID, &mine) != 0)
        return -1;
    int same = mine == its;
    void *(*fn)(size_t) = (void *(*)(size_t))(uintptr_t)dlsym(h, "helper_alloc");
    if (fn)
        free(fn(64));
    dlclose(self);
    dlclose(h);
    return same;
}
