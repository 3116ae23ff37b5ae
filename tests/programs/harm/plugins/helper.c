/* tests/programs/harm/plugins/helper.c: a library the plugin loads by name, found through
 * the plugin's DT_RUNPATH ($ORIGIN). */
#include <stdlib.h>

__attribute__((visibility("default"))) void *helper_alloc(size_t n);

__attribute__((visibility("default"))) void *helper_alloc(size_t n)
{
    return malloc(n);
}
