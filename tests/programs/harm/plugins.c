/* tests/programs/harm/plugins.c: a plugin loader, the way applications find their
 * plugins (issue 15, case 3; the safety review's A3). dlopen resolves DT_RUNPATH,
 * $ORIGIN and the namespace from its caller; a dlopen that libheapprof.so wraps finds
 * libheapprof.so's instead, and the plugin is not found.
 *
 * Usage: plugins runpath   dlopen("libharm_plug.so"), found through this program's
 *                          DT_RUNPATH (built with one naming the plugin directory)
 *        plugins origin    dlopen("$ORIGIN/plugins/libharm_plug.so")
 *        plugins dlmopen   dlmopen(LM_ID_NEWLM, ...) of the plugin, whose own dlopen of its
 *                          helper (through its DT_RUNPATH) must land in its namespace
 * Prints what the plugin computed; exits 0, or 1 when a library was not found. */
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

int main(int argc, char **argv)
{
    if (argc != 2)
        return 2;
    void *h;
    if (!strcmp(argv[1], "runpath"))
        h = dlopen("libharm_plug.so", RTLD_NOW | RTLD_LOCAL);
    else if (!strcmp(argv[1], "origin"))
        h = dlopen("$ORIGIN/plugins/libharm_plug.so", RTLD_NOW | RTLD_LOCAL);
    else if (!strcmp(argv[1], "dlmopen"))
        h = dlmopen(LM_ID_NEWLM, "$ORIGIN/plugins/libharm_plug.so", RTLD_NOW | RTLD_LOCAL);
    else
        return 2;
    if (!h) {
        printf("not found: %s\n", dlerror());
        return 1;
    }
    unsigned long (*work)(int) = (unsigned long (*)(int))(uintptr_t)dlsym(h, "plug_work");
    int (*same)(void) = (int (*)(void))(uintptr_t)dlsym(h, "plug_same_namespace");
    if (!work || !same)
        return 1;
    printf("%s: work %lu, helper in the plugin's namespace: %d\n", argv[1], work(2000), same());
    if (dlclose(h) != 0)
        return 1;
    return 0;
}
