/* preload/got.h: installing the hooks in GOT slots, for a program whose allocator comes
 * before libheapprof.so in the lookup order (preloaded before us, or in the executable),
 * so that its calls never reach our exports (see preload/alloc.h).
 *
 * In every loaded object but the allocator's and ours, each JUMP_SLOT or GLOB_DAT slot
 * of a malloc-family function that holds the allocator's function (or, with lazy
 * binding, still points into the object's own PLT) gets the hook instead. The hooks
 * forward to that same allocator, so a pointer allocated before the switch and freed
 * after it (or the reverse) still meets one allocator. Slots in the RELRO pages are
 * written through /proc/self/mem (client__direct_mem_cas(): no protection of the
 * program's ever changes), but only once those pages are read-only (/proc/self/maps says
 * so): until then a dlopen in another thread may still be relocating the object, and the
 * object is looked at again later. Slots bound to anything else (another interposer) are
 * left alone; a slot that could not be written is counted (client_stat_got_failures).
 * Each slot is written with one aligned 8-byte compare-and-swap (or the kernel's 8-byte
 * copy): a thread calling through it meanwhile gets either function.
 *
 * Loaded late (client__late: heapprof attach loaded the library into a running program),
 * the route is the same but the hooks are in only while a session is: the constructor
 * installs nothing, preload/direct.c records every slot and switches them around each
 * session, and the objects this patcher reaches during a session (loaded since) are
 * recorded there too, so that the session's end gives every slot its value back.
 *
 * Objects loaded later are patched when noticed: when dlopen returns (the exported
 * dlopen's wrapper for this route, preload/dl.c), at the first sample after a load in a
 * session with an unwind table (preload/record.c checks the loader's counts before every
 * such sample), and by client_got_check() on the sampled path, which compares the
 * loader's count of loaded objects with the last one seen, at most every
 * CLIENT_GOT_CHECK_NS (for code loaded otherwise: by a library's own DT_NEEDED dlopen,
 * say). The sampled path never waits for the loader's lock (preload/dl.c): while another
 * thread holds it, the patching waits for a later sample.
 *
 * C++'s operator new and delete go the same way, whatever the route, when the program's
 * operator new is the allocator's own (client_alloc_cxx, preload/alloc.h: jemalloc,
 * tcmalloc and mimalloc define them without calling malloc): the slots of each operator
 * the allocator defines get its hook (preload/hook.c). Operators the allocator lacks are
 * left to libstdc++'s, which call the allocator's through libstdc++'s own slots. Then,
 * with our exports first in the lookup order, the allocator's own slots of its malloc
 * family that bind to our exports get the allocator's functions back: an operator that
 * calls one through its PLT (jemalloc's aligned new calls aligned_alloc) is counted
 * once, by the operator's hook.
 *
 * Not reached this way (so not profiled, still consistent): calls the allocator makes to
 * itself, calls inside the executable when it is the allocator, and calls through
 * function pointers stored in data (R_X86_64_64).
 *
 * Hook-safe, with one exception said below.
 */
#ifndef HP_PRELOAD_GOT_H
#define HP_PRELOAD_GOT_H

#include <stdbool.h>
#include <stdint.h>

#pragma GCC visibility push(hidden)

#define CLIENT_GOT_CHECK_NS (100u * 1000u * 1000u)

/* True when hooks go into GOT slots: the GOT route, or C++ operators to hook
 * (client_alloc_cxx); false until the allocator is resolved. */
bool client_got_active(void);

/* Patches every loaded object (once per object; concurrent callers skip). Takes the
 * loader's lock (dl_iterate_phdr). */
void client_got_patch_loaded(void);

/* On the sampled path: with the GOT route, patches objects loaded since the last look,
 * at most every CLIENT_GOT_CHECK_NS, and only when the loader's lock is free (it never
 * waits for it: client_got_after_load()). */
void client_got_check(void);

/* dlopen returned: with the GOT route, patches the new objects now. Takes the loader's
 * lock (dl_iterate_phdr), waiting for it as dlopen itself did. From the dlopen wrapper
 * only. */
void client_got_after_dlopen(void);

/* The loader's count grew: client_got_after_dlopen() on the sampled path, when the
 * loader's lock is free; when another thread holds it, nothing now, and the next
 * client_got_check() tries again. Never waits for the lock. */
void client_got_after_load(void);

/* True when the page holding @addr is mapped read-only (/proc/self/maps): the loader has
 * relocated its object and protected the RELRO pages. Raw system calls, no allocation. */
bool client__page_readonly(uintptr_t addr);

/* Slots written so far, and slots that could not be written (tests and statistics). */
extern _Atomic uint64_t client_stat_got_slots;
extern _Atomic uint64_t client_stat_got_failures;

#pragma GCC visibility pop

#endif
