/* preload/got.h: installing the hooks in GOT slots, for a program whose allocator comes
 * before libheapprof.so in the lookup order (preloaded before us, or in the executable),
 * so that its calls never reach our exports (see preload/alloc.h).
 *
 * In every loaded object but the allocator's and ours, each JUMP_SLOT or GLOB_DAT slot
 * of a malloc-family function that holds the allocator's function (or, with lazy
 * binding, still points into the object's own PLT) gets the hook instead. The hooks
 * forward to that same allocator, so a pointer allocated before the switch and freed
 * after it (or the reverse) still meets one allocator. Slots in the RELRO pages are made
 * writable for the write and read-only again (mprotect), but only once those pages are
 * read-only (/proc/self/maps says so): until then a dlopen in another thread may still
 * be relocating the object, and the object is looked at again later. Slots bound to
 * anything else (another interposer) are left alone. Each slot is written with one aligned 8-byte
 * store: a thread calling through it meanwhile gets either function.
 *
 * Objects loaded later are patched when noticed: when dlopen returns (the exported
 * dlopen's wrapper for this route, preload/dl.c), at the first sample after a load in a
 * session with an unwind table (preload/hook.c checks the loader's counts before every
 * such sample), and by client_got_check() on the sampled path, which compares the
 * loader's count of loaded objects with the last one seen, at most every
 * CLIENT_GOT_CHECK_NS (for code loaded otherwise: by a library's own DT_NEEDED dlopen,
 * say).
 *
 * Not reached this way (so not profiled, still consistent): calls the allocator makes to
 * itself, calls inside the executable when it is the allocator, calls through function
 * pointers stored in data (R_X86_64_64), and C++ operator new/delete when the allocator
 * defines its own (jemalloc, tcmalloc and mimalloc do).
 *
 * Hook-safe, with one exception said below.
 */
#ifndef HP_PRELOAD_GOT_H
#define HP_PRELOAD_GOT_H

#include <stdint.h>

#pragma GCC visibility push(hidden)

#define CLIENT_GOT_CHECK_NS (100u * 1000u * 1000u)

/* Patches every loaded object (once per object; concurrent callers skip). Takes the
 * loader's lock (dl_iterate_phdr) and calls mprotect. */
void client_got_patch_loaded(void);

/* On the sampled path: with the GOT route, patches objects loaded since the last look.
 * Takes the loader's lock at most every CLIENT_GOT_CHECK_NS. */
void client_got_check(void);

/* Objects were loaded (dlopen returned, or the loader's count grew): with the GOT route,
 * patches them now. Takes the loader's lock (dl_iterate_phdr) and calls mprotect, as
 * client_got_check() does; from the dlopen wrapper or the sampled path. */
void client_got_after_dlopen(void);

/* Slots written so far (tests and statistics). */
extern _Atomic uint64_t client_stat_got_slots;

#pragma GCC visibility pop

#endif
