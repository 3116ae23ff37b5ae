/* preload/env.c: removing the profiler from an environment array. See preload/env.h. */
#include "preload/env.h"

#include <string.h>

/* The separators ld.so accepts between LD_PRELOAD entries. */
static bool env_is_sep(char c)
{
    return c == ' ' || c == ':';
}

bool client_env_is_lib(const char *entry, size_t len, const char *lib_name)
{
    size_t base = len;
    while (base > 0 && entry[base - 1] != '/')
        base--;
    size_t n = strlen(lib_name);
    return len - base == n && memcmp(entry + base, lib_name, n) == 0;
}

size_t client_env_strip_preload(char *value, const char *lib_name)
{
    size_t removed = 0;
    for (const char *p = value; *p;) {
        while (env_is_sep(*p))
            p++;
        const char *start = p;
        while (*p && !env_is_sep(*p))
            p++;
        if (p > start && client_env_is_lib(start, (size_t)(p - start), lib_name))
            removed++;
    }
    if (removed == 0)
        return 0;

    /* The write position never passes the read position: the string only shrinks, and
     * memmove copes with the overlap. */
    char *out = value;
    for (const char *p = value; *p;) {
        const char *sep = p;
        while (env_is_sep(*p))
            p++;
        size_t sep_len = (size_t)(p - sep);
        const char *start = p;
        while (*p && !env_is_sep(*p))
            p++;
        size_t len = (size_t)(p - start);
        if (len == 0 || client_env_is_lib(start, len, lib_name))
            continue;
        if (out != value) {
            memmove(out, sep, sep_len);
            out += sep_len;
        }
        memmove(out, start, len);
        out += len;
    }
    *out = '\0';
    return removed;
}

static void env_remove_at(char **env, size_t i)
{
    for (; env[i]; i++)
        env[i] = env[i + 1];
}

static bool env_has_name(const char *entry, const char *name)
{
    size_t n = strlen(name);
    return strncmp(entry, name, n) == 0 && entry[n] == '=';
}

size_t client_env_scrub(char **env, const char *const *names, const char *lib_name)
{
    static const char preload[] = "LD_PRELOAD";
    size_t changes = 0;

    if (!env)
        return 0;
    for (size_t i = 0; env[i];) {
        char *e = env[i];
        bool drop = false;
        if (env_has_name(e, preload)) {
            size_t removed = client_env_strip_preload(e + sizeof(preload), lib_name);
            changes += removed;
            /* Nothing left but our own entries: no LD_PRELOAD at all, as if the user had
             * never set it. */
            drop = removed > 0 && e[sizeof(preload)] == '\0';
        }
        for (const char *const *n = names; n && *n && !drop; n++)
            drop = env_has_name(e, *n);
        if (drop) {
            env_remove_at(env, i);
            changes++;
            continue;
        }
        i++;
    }
    return changes;
}
