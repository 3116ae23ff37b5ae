/* unwinder/global.h: the state of unwinder/ shared by all processes and threads
 * (internal to unwinder/): the string table that interns paths and function names, and
 * the table of interned, immutable struct hp_mapping objects.
 *
 *     const char *name = unwinder__intern("main", 4);        // same pointer for equal text
 *     const struct hp_mapping *m = unwinder__mapping_intern(&tmpl);
 *
 * Thread-safe once unwinder_global_init() returned; everything handed out stays valid
 * until unwinder_global_done().
 */
#ifndef HP_UNWINDER_GLOBAL_H
#define HP_UNWINDER_GLOBAL_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "common/frame.h"

/* Interned copy of @s[0..len). On allocation failure returns the interned "" (never
 * NULL), so callers can always store the result in a frame. */
const char *unwinder__intern(const char *s, size_t len);

/* The interned "". */
const char *unwinder__empty(void);

/* Interned copy of @tmpl: equal content (path compared by pointer, so intern it first;
 * build_id compared up to build_id_len) gives the same pointer. NULL on ENOMEM. */
const struct hp_mapping *unwinder__mapping_intern(const struct hp_mapping *tmpl);

/* Adds @delta to the heap bytes reported by unwinder_global_bytes(). */
void unwinder__account(ssize_t delta);

/* The ELF cache's part of unwinder_global_init()/done() (unwinder/elf_cache.c). */
int unwinder__elf_cache_init(void);
void unwinder__elf_cache_done(void);

/* How old a process's maps may get before an unwind rereads them (unwinder/unwind.c;
 * default 1 s; rereading identical maps keeps every cache). For tests. */
extern uint64_t unwinder__maps_refresh_ns;

/* How unwinder/srcline.c asks debuginfod for the debug file of a build id (when
 * DEBUGINFOD_URLS is set): 0 with a malloc'd path, or -errno. Replaceable for tests. */
extern int (*unwinder__debuginfod_fetch)(const uint8_t *build_id, uint32_t len, char **ret_path);

/* How many times unwinder/srcline.c asked debuginfod (one per file at most). */
unsigned long unwinder__debuginfod_tries(void);

/* Releases the source-line cache (unwinder/srcline.c). */
void unwinder__srcline_done(void);

#endif
