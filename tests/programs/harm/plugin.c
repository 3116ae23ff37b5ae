/* tests/programs/harm/plugin.c: the plugin tests/programs/harm/plugin_host.c loads; it
 * allocates from its own code (harm_plugin_alloc), about 40 MB in all. */
#include <stdlib.h>
#include <string.h>

long harm_plugin_run(int n);

__attribute__((noinline)) static char *harm_plugin_alloc(size_t size)
{
    char *p = malloc(size);
    if (p)
        memset(p, 7, size);
    return p;
}

__attribute__((visibility("default"))) long harm_plugin_run(int n)
{
    long sum = 0;
    for (int i = 0; i < n; i++) {
        char *p = harm_plugin_alloc(1000 + (size_t)(i % 2000));
        if (!p)
            return -1;
        sum += p[i % 1000];
        free(p);
    }
    return sum;
}
