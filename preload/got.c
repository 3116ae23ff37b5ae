/* preload/got.c: see got.h. */
#include "preload/got.h"

#include <errno.h>
#include <fcntl.h>
#include <link.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/macros.h"
#include "preload/alloc.h"
#include "preload/client.h"
#include "preload/direct.h"
#include "preload/elfobj.h"
#include "preload/slotuse.h"

_Atomic uint64_t client_stat_got_slots;

/* One patcher at a time; a caller that finds it busy leaves the work to the holder. */
static _Atomic bool got_busy;
static _Atomic uint64_t got_seen_adds;
static _Atomic uint64_t got_last_check_ns;

/* The function of the slot of @name to patch in an object not the allocator's, or -1: a
 * malloc-family name with the GOT route, a C++ operator the allocator defines when the
 * program's operator new is its own (client_alloc_cxx). */
static int got_fn_of(const char *name, int route)
{
    /* Every name of the family starts with one of these letters, every operator's with _Z
     * and then n or d. */
    if (!name)
        return -1;
    int from, to;
    if (name[0] == '_') {
        if (!client_alloc_cxx || name[1] != 'Z' || (name[2] != 'n' && name[2] != 'd'))
            return -1;
        from = CLIENT_FN_CXX_NEW;
        to = CLIENT_N_FN;
    } else {
        if (route != CLIENT_ROUTE_GOT || !strchr("acfmprv", name[0]))
            return -1;
        from = 0;
        to = CLIENT_FN_CXX_NEW;
    }
    for (int i = from; i < to; i++)
        if (strcmp(name, client_fn_names[i]) == 0)
            return (i < CLIENT_FN_CXX_NEW || client_alloc_own[i]) ? i : -1;
    return -1;
}

/* The function of the slot of @name to give back to the allocator in its own object, or
 * -1. With C++ operators hooked and our exports first in the lookup order, the
 * allocator's calls to its own malloc family through its PLT reach our exports: jemalloc's
 * aligned operator new calls aligned_alloc so, and would be counted twice (by the
 * operator's hook and the export's). Such calls go straight to the allocator instead, as
 * they do with the GOT route. */
static int got_own_fn_of(const char *name, int route)
{
    if (!name || route != CLIENT_ROUTE_EXPORTS || !client_alloc_cxx || !strchr("acfmprv", name[0]))
        return -1;
    for (int i = 0; i < CLIENT_FN_CXX_NEW; i++)
        if (strcmp(name, client_fn_names[i]) == 0)
            return client_alloc_own[i] ? i : -1;
    return -1;
}

bool client_got_active(void)
{
    /* Acquire pairs with the release store of the route: client_alloc_own and
     * client_alloc_cxx are complete. */
    int route = atomic_load_explicit(&client_alloc_route, memory_order_acquire);
    if (route != CLIENT_ROUTE_GOT && (route == CLIENT_ROUTE_UNRESOLVED || !client_alloc_cxx))
        return false;
    /* Loaded late: hooks only while a session is on (its end gives the slots back). */
    return !client__late || atomic_load_explicit(&client_current, memory_order_acquire) != NULL;
}

/* An object was skipped (still being relocated): look again at the next check. */
static _Atomic bool got_retry;

static bool got_hex(const char **p, const char *end, uintptr_t *ret)
{
    uintptr_t v = 0;
    const char *s = *p;
    for (; s < end; s++) {
        unsigned d;
        if (*s >= '0' && *s <= '9')
            d = (unsigned)(*s - '0');
        else if (*s >= 'a' && *s <= 'f')
            d = (unsigned)(*s - 'a' + 10);
        else
            break;
        v = v * 16 + d;
    }
    if (s == *p)
        return false;
    *p = s;
    *ret = v;
    return true;
}

/* Whether the mapping line [@s, @end) of /proc/self/maps holds @addr; *ret_ro: without
 * write permission. */
static bool got_maps_line(const char *s, const char *end, uintptr_t addr, bool *ret_ro)
{
    uintptr_t lo, hi;
    if (!got_hex(&s, end, &lo) || s == end || *s++ != '-' || !got_hex(&s, end, &hi) ||
        end - s < 3 || *s != ' ')
        return false;
    if (addr < lo || addr >= hi)
        return false;
    *ret_ro = s[2] != 'w';
    return true;
}

/* True when the page holding @addr is mapped read-only: the loader has finished
 * relocating the object and protected its RELRO pages (glibc does so at the end of each
 * object's relocation). Write permission means a dlopen in another thread may still be
 * relocating it: making the pages read-only again after our write would fault its
 * relocation. Raw system calls and a stack buffer; once per object patched (and per object
 * made direct, preload/direct.c). */
bool client__page_readonly(uintptr_t addr)
{
    int fd = (int)syscall(SYS_openat, AT_FDCWD, "/proc/self/maps", O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return false;
    char buf[4096];
    size_t have = 0;
    bool found = false, ro = false;
    while (!found) {
        long n = syscall(SYS_read, fd, buf + have, sizeof(buf) - have);
        if (n <= 0)
            break;
        have += (size_t)n;
        size_t start = 0;
        for (size_t i = 0; i < have && !found; i++) {
            if (buf[i] != '\n')
                continue;
            found = got_maps_line(buf + start, buf + i, addr, &ro);
            start = i + 1;
        }
        if (start == 0 && have == sizeof(buf))
            start = have; /* a line longer than the buffer holds no address of ours */
        memmove(buf, buf + start, have - start);
        have -= start;
    }
    (void)syscall(SYS_close, fd);
    return found && ro;
}

struct got_obj {
    const struct client_elfobj *o;
    int route;          /* client_alloc_route */
    bool is_alloc;      /* the allocator's object: its calls to itself (got_own_fn_of) */
    bool relro_checked; /* client__page_readonly() was asked */
    bool relro_failed;  /* not settled yet (still being relocated): RELRO slots left */
};

_Atomic uint64_t client_stat_got_failures;

static void got_patch_slot(struct got_obj *g, const Elf64_Rela *r)
{
    const struct client_elfobj *o = g->o;
    unsigned type = ELF64_R_TYPE(r->r_info);
    if (type != R_X86_64_JUMP_SLOT && type != R_X86_64_GLOB_DAT)
        return;
    const char *name = client_elfobj_reloc_name(o, r);
    int fn = g->is_alloc ? got_own_fn_of(name, g->route) : got_fn_of(name, g->route);
    if (fn < 0)
        return;
    uintptr_t addr = o->bias + r->r_offset;
    if (addr < o->lo || addr + sizeof(uintptr_t) > o->hi || addr % sizeof(uintptr_t) != 0)
        return;
    /* Loaded late, as the slots the library found when it was loaded (preload/direct.c):
     * a GLOB_DAT slot whose address the code takes keeps the allocator's, so `&malloc`
     * keeps one value; its calls, if any, are not seen (counted). The object is mapped:
     * its code is read directly. */
    if (client__late && type == R_X86_64_GLOB_DAT && !g->is_alloc) {
        struct slotuse u = {0};
        (void)client_slotuse_of_range(o->exec_lo, o->exec_hi, -1, &addr, 1, &u);
        if (u.others > 0 || u.calls == 0) {
            if (u.others > 0 && u.calls > 0)
                atomic_fetch_add_explicit(&client_stat_got_failures, 1, memory_order_relaxed);
            return;
        }
    }
    _Atomic uintptr_t *slot = (_Atomic uintptr_t *)addr;
    uintptr_t cur = atomic_load_explicit(slot, memory_order_relaxed);
    uintptr_t hook = (uintptr_t)client_hook_fns[fn];
    uintptr_t own = (uintptr_t)client_alloc_own[fn];
    uintptr_t want = hook;
    if (g->is_alloc) {
        /* Bound to our export (the hook), or not bound yet: the allocator's own. */
        if (cur == own || !(cur == hook || client_elfobj_contains(o, cur)))
            return;
        want = own;
    } else if (cur == hook || !((own && cur == own) || client_elfobj_contains(o, cur))) {
        /* Not bound to the allocator, nor (lazy binding) into the object's PLT. An object
         * dlopened right now is listed before the loader relocates it: a lazy slot outside
         * RELRO that still holds its link-time value (a PLT address without the load
         * bias) is bound later, and the next check patches it. (Slots in RELRO wait for
         * its protection: relro_failed. A 0 is left alone: after relocation it is a weak
         * symbol nobody defines, looked at again on every check otherwise.) */
        if (cur != hook && o->bias && client_elfobj_contains(o, cur + o->bias))
            atomic_store_explicit(&got_retry, true, memory_order_relaxed);
        return;
    }
    bool ok;
    if (addr >= o->relro_lo && addr < o->relro_hi) {
        if (!g->relro_checked) {
            g->relro_checked = true;
            if (!client__page_readonly(o->relro_lo)) {
                g->relro_failed = true;
                atomic_store_explicit(&got_retry, true, memory_order_relaxed);
            }
        }
        if (g->relro_failed)
            return;
        /* Read-only: written through /proc/self/mem, the protection left as the program
         * has it (it may change it itself at any time: preload/direct.c). */
        ok = client__direct_mem_cas(addr, cur, want);
    } else {
        ok = atomic_compare_exchange_strong_explicit(slot, &cur, want, memory_order_relaxed,
                                                     memory_order_relaxed);
    }
    if (!ok) {
        atomic_fetch_add_explicit(&client_stat_got_failures, 1, memory_order_relaxed);
        return;
    }
    atomic_fetch_add_explicit(&client_stat_got_slots, 1, memory_order_relaxed);
    /* Loaded late: given back when the session ends. */
    if (client__late && !g->is_alloc)
        (void)client__direct_add_late(addr, fn, cur);
}

static int got_patch_cb(struct dl_phdr_info *info, size_t size, void *arg)
{
    (void)arg;
    if (size >= offsetof(struct dl_phdr_info, dlpi_adds) + sizeof(info->dlpi_adds))
        atomic_store_explicit(&got_seen_adds, info->dlpi_adds, memory_order_relaxed);
    struct client_elfobj o;
    if (client_elfobj_init(&o, info) < 0)
        return 0;
    /* Not us; in the allocator, only its calls to itself (they stay its own). */
    if (client_elfobj_contains(&o, (uintptr_t)&client_got_patch_loaded))
        return 0;
    struct got_obj g = {
        .o = &o,
        .route = atomic_load_explicit(&client_alloc_route, memory_order_acquire),
        .is_alloc = client_elfobj_contains(&o, (uintptr_t)client_alloc_own[CLIENT_FN_MALLOC]),
    };
    if (g.is_alloc && (g.route != CLIENT_ROUTE_EXPORTS || !client_alloc_cxx))
        return 0;
    /* Loaded late: not the loader, whose slots the preloaded library never sees either. */
    const char *name = info->dlpi_name ? info->dlpi_name : "";
    const char *base = strrchr(name, '/');
    if (client__late && strncmp(base ? base + 1 : name, "ld-linux", 8) == 0)
        return 0;
    for (size_t i = 0; i < o.n_jmprel; i++)
        got_patch_slot(&g, &o.jmprel[i]);
    for (size_t i = 0; i < o.n_rela; i++)
        got_patch_slot(&g, &o.rela[i]);
    return 0;
}

void client_got_patch_loaded(void)
{
    if (atomic_exchange_explicit(&got_busy, true, memory_order_acquire))
        return;
    int saved_errno = errno;
    atomic_store_explicit(&got_retry, false, memory_order_relaxed);
    (void)dl_iterate_phdr(got_patch_cb, NULL);
    /* An object still being relocated: the next check patches again. */
    if (atomic_load_explicit(&got_retry, memory_order_relaxed))
        atomic_store_explicit(&got_seen_adds, 0, memory_order_relaxed);
    errno = saved_errno;
    atomic_store_explicit(&got_busy, false, memory_order_release);
}

void client_got_after_dlopen(void)
{
    if (client_got_active())
        client_got_patch_loaded();
}

void client_got_after_load(void)
{
    if (!client_got_active())
        return;
    /* Held by another thread: the next check patches (got_seen_adds stays behind). */
    if (!client_dl_lock_try()) {
        atomic_store_explicit(&got_seen_adds, 0, memory_order_relaxed);
        return;
    }
    client_got_patch_loaded(); /* takes the lock again, recursively: no wait */
    client_dl_unlock();
}

void client_got_check(void)
{
    if (HP_LIKELY(!client_got_active()))
        return;
    uint64_t now_ns = hp_clock_ns(CLOCK_MONOTONIC_COARSE);
    uint64_t last = atomic_load_explicit(&got_last_check_ns, memory_order_relaxed);
    if (now_ns - last < CLIENT_GOT_CHECK_NS ||
        !atomic_compare_exchange_strong_explicit(&got_last_check_ns, &last, now_ns,
                                                 memory_order_relaxed, memory_order_relaxed))
        return;
    int saved_errno = errno;
    uint64_t adds, subs;
    if (client_dl_counts(&adds, &subs) == CLIENT_DL_OK &&
        adds != atomic_load_explicit(&got_seen_adds, memory_order_relaxed))
        client_got_after_load();
    errno = saved_errno;
}
