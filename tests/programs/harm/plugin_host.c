/* tests/programs/harm/plugin_host.c: loads a plugin with dlopen (its path is argv[1])
 * after start-up and has it allocate: code that comes after the profiler installed its
 * hooks, for the every-program matrix (with an allocator preloaded before libheapprof.so
 * the plugin's calls reach the hooks only once its GOT slots are patched too).
 * Prints the plugin's checksum.
 */
#include <dlfcn.h>
#include <stdio.h>

int main(int argc, char **argv)
{
    if (argc < 2)
        return 2;
    void *h = dlopen(argv[1], RTLD_NOW);
    if (!h) {
        printf("dlopen failed\n");
        return 1;
    }
    long (*run)(int) = (long (*)(int))dlsym(h, "harm_plugin_run");
    if (!run)
        return 1;
    printf("plugin: %ld\n", run(20000));
    return 0;
}
