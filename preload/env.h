/* preload/env.h: removing the profiler from an environment array (internal).
 *
 * With HEAPPROF_FOLLOW_EXEC=0 the client takes itself out of its own environment before
 * the program's main() runs, so that programs it executes (same pid, or fork+exec) start
 * without libheapprof.so: the library's entries leave LD_PRELOAD (the other preloaded
 * libraries stay, in order, with the separators between them) and the client's
 * HEAPPROF_* variables are removed. The editing happens in place, like unsetenv(3) does
 * it: entries of the array move down, an LD_PRELOAD string only ever gets shorter.
 *
 *     static const char *const names[] = {"HEAPPROF_SOCKET", NULL};
 *     client_env_scrub(environ, names, CLIENT_LIB_NAME);
 *
 * Hook-safe: no allocation, no lock, no libc call other than string functions. Not
 * thread-safe; the caller makes sure nobody else reads or edits the array meanwhile.
 */
#ifndef HP_PRELOAD_ENV_H
#define HP_PRELOAD_ENV_H

#include <stdbool.h>
#include <stddef.h>

#pragma GCC visibility push(hidden)

/* File name of the library as it appears in LD_PRELOAD entries. */
#define CLIENT_LIB_NAME "libheapprof.so"

/* True when the LD_PRELOAD entry @entry (@len bytes, not NUL-terminated) names a file
 * called @lib_name: "libheapprof.so", "/any/dir/libheapprof.so". */
bool client_env_is_lib(const char *entry, size_t len, const char *lib_name);

/* Removes from LD_PRELOAD's value @value (a writable NUL-terminated string, edited in
 * place) every entry that client_env_is_lib() matches. ld.so separates entries by
 * spaces and colons: a kept entry keeps the separators that preceded it, separators at
 * either end are dropped once something was removed. Returns the number of entries
 * removed; @value is untouched when that is 0. */
size_t client_env_strip_preload(char *value, const char *lib_name);

/* Edits the NULL-terminated array @env in place: every "NAME=..." entry whose NAME is in
 * @names (NULL-terminated) is removed, every LD_PRELOAD entry loses the entries naming
 * @lib_name and is removed when nothing but separators is left. The strings of @env that
 * change must be writable. Returns the number of changes (removed variables plus removed
 * LD_PRELOAD entries); NULL @env: 0. */
size_t client_env_scrub(char **env, const char *const *names, const char *lib_name);

#pragma GCC visibility pop

#endif
