/* preload/direct.h: while dormant, the program's calls to malloc & co go straight to the
 * allocator, not through our exports.
 *
 * A preloaded interposer, however little it does, costs the indirect jump from the
 * program's PLT to it and the one from it to the allocator (a malloc+free pair of a large
 * block takes 5-8% longer through a wrapper that only forwards). So, when our exports are
 * what the program's calls bind to (CLIENT_ROUTE_EXPORTS) and no C++ operator is hooked,
 * the constructor records the JUMP_SLOT slots of the malloc family in the objects loaded
 * at startup (never unloaded: their addresses stay valid for the life of the process) that
 * hold our hook (or, with lazy binding, still point into the object's own PLT), and writes
 * the allocator's own function into each: "direct". A session writes the hooks back before
 * it is published and the allocator's functions again once it has ended.
 *
 * Only JUMP_SLOT slots: a GLOB_DAT slot also serves `&malloc`, whose value must not change.
 * Objects loaded later, slots beyond CLIENT_DIRECT_MAX_SLOTS and GLOB_DAT slots keep the
 * hooks: correct, only not free. Both values of a slot are complete functions of the same
 * allocator (the hooks forward to it), so a thread calling through a slot while it is
 * written gets either; each slot is written only while it holds the value we left there,
 * so a slot someone else rewrote (another GOT patcher) is left alone, and a lazy binding
 * that writes our hook meanwhile is as good: a writable slot with one aligned 8-byte
 * compare-and-swap, a slot in RELRO pages (read-only: full RELRO, -z now) through
 * /proc/self/mem, read first, then written. No protection of the program's is ever changed
 * (it may patch its own GOT and keep the pages writable, or open and close them around
 * each patch). Where /proc/self/mem cannot be opened at startup (no /proc, a non-dumpable
 * process) or does not write through read-only pages (proc_mem.force_override=never), the
 * RELRO slots keep the hooks: calls are seen, at the hooks' cost. A slot that could be made
 * direct but not switched back for a session is counted (client_stat_direct_unseen).
 *
 * Which objects count as loaded at startup: the executable, and every object a DT_NEEDED
 * entry of one of those names unambiguously (one loaded object has that name or soname).
 * An object a constructor dlopened before ours (which a dlclose may unmap) is never
 * counted; neither are other preloaded objects (they keep the hooks).
 *
 *     client_direct_init();        constructor, dormant or not
 *     client_direct_hold();        before publishing a session
 *     client_direct_release();     after a session ended
 *
 * HEAPPROF_DORMANT_DIRECT=0 turns this off (every call then goes through the hooks).
 *
 * Loaded late (client__late: heapprof attach loaded the library into a running program,
 * service/inject.c), the same switch serves the GOT route the other way round: at rest
 * the slots hold the allocator's functions, as the program bound them. The constructor
 * records the JUMP_SLOT and GLOB_DAT slots of the malloc family (and of the C++ operators
 * the allocator defines) that hold them in every loaded object but ours, ld.so's and the
 * vDSO's (the C library's own too: strdup's, fopen's), all written through
 * /proc/self/mem, which, where an object has been unloaded since, fails instead of
 * faulting; a session writes the hooks in and its end writes the recorded value back,
 * only into slots that still hold the hook. The GOT patcher adds the slots of objects
 * loaded during a session (client__direct_add_late()). While a session is on, `&malloc`
 * read through a GLOB_DAT slot is the hook: a pointer to malloc kept from before the
 * attach compares unequal to one taken during the session.
 */
#ifndef HP_PRELOAD_DIRECT_H
#define HP_PRELOAD_DIRECT_H

#include <stdbool.h>
#include <stdint.h>

#pragma GCC visibility push(hidden)

#define CLIENT_DIRECT_MAX_SLOTS 2048u

/* Records the slots and, when no session is on, makes them direct. Once, from the
 * constructor (a normal thread: takes the loader's lock, reads /proc/self/maps, opens
 * /proc/self/mem and keeps it open, O_CLOEXEC). */
void client_direct_init(void);

/* A session is about to be published: the hooks go back into every recorded slot. Owner
 * of the sessions only; raw system calls, no libc, no allocation (the session thread has
 * no glibc thread state). */
void client_direct_hold(void);

/* The session ended (client_current is NULL, the fast interval CLIENT_FAST_OFF): the
 * slots become direct again. Same conditions as client_direct_hold(). */
void client_direct_release(void);

/* In a forked child, by the owner of the sessions (the atfork handler, or the session
 * thread of a child adopted at a wake, preload/wake.c): another thread of the parent may
 * have been switching the slots; forgets its lock and writes every slot again (direct:
 * the child is dormant until it opens a session of its own), through a /proc/self/mem of
 * its own. */
void client_direct_atfork_child(void);

/* Writes @want over @cur into the word at @addr through /proc/self/mem (read first: only
 * when it holds @cur); true when it holds @want after. For slots in read-only pages:
 * no protection changes. Takes the switching lock; raw system calls. */
bool client__direct_mem_cas(uintptr_t addr, uintptr_t cur, uintptr_t want);

/* Late mode (client__late): the GOT patcher wrote the hook of @fn over @was into the slot
 * at @addr of an object loaded after the library; recorded, so that the end of the
 * session gives the slot back. False when not in late mode or the table is full. */
bool client__direct_add_late(uintptr_t addr, int fn, uintptr_t was);

/* HEAPPROF_DORMANT_DIRECT=0 (read by client_init()). */
extern bool client__direct_disabled;

/* Slots recorded, and whether any is direct now (tests and statistics). */
extern _Atomic uint32_t client_stat_direct_slots;
extern _Atomic bool client_stat_direct_on;
/* Slots left direct by the last client_direct_hold(): the session does not see their
 * calls (0 after client_direct_release()). */
extern _Atomic uint32_t client_stat_direct_unseen;
/* Slots a pass could not switch (either way), since startup. */
extern _Atomic uint64_t client_stat_direct_failures;

#pragma GCC visibility pop

#endif
