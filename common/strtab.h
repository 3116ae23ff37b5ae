/* common/strtab.h: a thread-safe interner for immutable strings that live as long as
 * the table. Used for function names and paths shared between service threads.
 *
 *     hp_strtab_t *t = hp_strtab_new();
 *     const char *a = hp_strtab_intern(t, "main", 4);   // same pointer for equal strings
 *     t = hp_strtab_free(t);
 *
 * Thread-safe (one mutex; callers cache results per thread when hot).
 */
#ifndef HP_COMMON_STRTAB_H
#define HP_COMMON_STRTAB_H

#include <stddef.h>

typedef struct hp_strtab hp_strtab_t;

hp_strtab_t *hp_strtab_new(void);
hp_strtab_t *hp_strtab_free(hp_strtab_t *t);
/* Returns the interned copy of @s[0..len), or NULL on allocation failure. Borrowed; valid
 * until hp_strtab_free(). */
const char *hp_strtab_intern(hp_strtab_t *t, const char *s, size_t len);
/* Bytes held by the table (strings and index). */
size_t hp_strtab_bytes(hp_strtab_t *t);

#endif
