/* preload/direct.c: see direct.h. */
#include "preload/direct.h"

#include <elf.h>
#include <link.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>

#include "common/macros.h"
#include "common/sys.h"
#include "preload/alloc.h"
#include "preload/client.h"
#include "preload/elfobj.h"
#include "preload/got.h"

bool client__direct_disabled;
_Atomic uint32_t client_stat_direct_slots;
_Atomic bool client_stat_direct_on;

/* A recorded slot: which function, what it held when recorded (kept only when it pointed
 * into its object's PLT: lazy binding), and the RELRO range it lies in (direct_n_relro:
 * none, the slot's page is writable). */
struct direct_slot {
    _Atomic uintptr_t *slot;
    uintptr_t lazy;
    uint16_t fn;
    uint16_t relro;
};

#define DIRECT_MAX_RELRO 64u

/* Written by client_direct_init() before direct_ready is set (release), read-only after;
 * the switching functions read them after an acquire load of direct_ready. */
static struct direct_slot direct_slots[CLIENT_DIRECT_MAX_SLOTS];
static uint32_t direct_n;
static struct {
    uintptr_t lo, hi;
} direct_relro[DIRECT_MAX_RELRO];
static uint32_t direct_n_relro;
static _Atomic bool direct_ready;

/* Serialises the switches (the constructor against a startup session's thread); held only
 * around a pass over the slots, never while taking another lock. direct_held: a session
 * is open or being opened (under the lock). */
static _Atomic bool direct_lock;
static bool direct_held;

static void direct_lock_take(void)
{
    while (atomic_exchange_explicit(&direct_lock, true, memory_order_acquire)) {
        struct timespec ts = {0, 100000};
        (void)hp_sys2(SYS_nanosleep, (long)&ts, 0);
    }
}

static void direct_lock_drop(void)
{
    /* Release pairs with the acquire exchange of the next taker. */
    atomic_store_explicit(&direct_lock, false, memory_order_release);
}

/* Writes @want into @s when it holds @from or its lazy value; leaves anything else. */
static void direct_write_slot(const struct direct_slot *s, bool direct)
{
    uintptr_t hook = (uintptr_t)client_hook_fns[s->fn];
    uintptr_t own = (uintptr_t)client_alloc_own[s->fn];
    uintptr_t want = direct ? own : hook, from = direct ? hook : own;
    uintptr_t cur = atomic_load_explicit(s->slot, memory_order_relaxed);
    if (cur == want || (cur != from && (s->lazy == 0 || cur != s->lazy)))
        return;
    (void)atomic_compare_exchange_strong_explicit(s->slot, &cur, want, memory_order_relaxed,
                                                  memory_order_relaxed);
}

/* One pass over every recorded slot. Each RELRO range is made writable, written and made
 * read-only again before the next: a range whose mprotect fails is left as it is. */
static void direct_apply_locked(bool direct)
{
    for (uint32_t r = 0; r <= direct_n_relro; r++) {
        bool relro = r < direct_n_relro;
        if (relro &&
            hp_sys3(SYS_mprotect, (long)direct_relro[r].lo,
                    (long)(direct_relro[r].hi - direct_relro[r].lo), PROT_READ | PROT_WRITE) < 0)
            continue;
        for (uint32_t i = 0; i < direct_n; i++)
            if (direct_slots[i].relro == r)
                direct_write_slot(&direct_slots[i], direct);
        if (relro)
            (void)hp_sys3(SYS_mprotect, (long)direct_relro[r].lo,
                          (long)(direct_relro[r].hi - direct_relro[r].lo), PROT_READ);
    }
    atomic_store_explicit(&client_stat_direct_on, direct, memory_order_relaxed);
}

void client_direct_hold(void)
{
    direct_lock_take();
    direct_held = true;
    if (atomic_load_explicit(&direct_ready, memory_order_acquire))
        direct_apply_locked(false);
    direct_lock_drop();
}

void client_direct_release(void)
{
    direct_lock_take();
    direct_held = false;
    if (atomic_load_explicit(&direct_ready, memory_order_acquire))
        direct_apply_locked(true);
    direct_lock_drop();
}

void client_direct_atfork_child(void)
{
    /* The lock's holder, if any, was another thread of the parent: it does not exist
     * here, and may have left a RELRO range writable; the pass below closes it again. */
    atomic_store_explicit(&direct_lock, false, memory_order_relaxed);
    client_direct_release();
}

/* ---- recording, in the constructor --------------------------------------------------- */

#define DIRECT_MAX_OBJS 256u
#define DIRECT_NAME_MAX 256u

/* What the constructor notes of each loaded object before it knows which were loaded at
 * startup: names are copied, as an object dlopened by another thread may go away. */
struct direct_obj {
    struct dl_phdr_info info; /* dlpi_phdr is read only once the object is known initial */
    char name[DIRECT_NAME_MAX];
    char soname[DIRECT_NAME_MAX];
    bool initial;
    bool self;
};

struct direct_scan {
    struct direct_obj *objs;
    uint32_t n;
    bool overflow;
};

static const Elf64_Dyn *direct_dynamic(const struct dl_phdr_info *info)
{
    for (unsigned i = 0; i < info->dlpi_phnum; i++)
        if (info->dlpi_phdr[i].p_type == PT_DYNAMIC)
            return (const Elf64_Dyn *)(info->dlpi_addr + info->dlpi_phdr[i].p_vaddr);
    return NULL;
}

/* Copies @s into @buf; a name that does not fit is left empty (it matches nothing). */
static void direct_copy(char *buf, const char *s)
{
    size_t n = s ? strnlen(s, DIRECT_NAME_MAX) : 0;
    buf[0] = '\0';
    if (n < DIRECT_NAME_MAX && n > 0)
        memcpy(buf, s, n + 1);
}

static int direct_scan_cb(struct dl_phdr_info *info, size_t size, void *arg)
{
    (void)size;
    struct direct_scan *sc = arg;
    if (sc->n == DIRECT_MAX_OBJS) {
        sc->overflow = true;
        return 1;
    }
    struct direct_obj *d = &sc->objs[sc->n++];
    memset(&d->info, 0, sizeof(d->info));
    d->info.dlpi_addr = info->dlpi_addr;
    d->info.dlpi_name = NULL;
    d->info.dlpi_phdr = info->dlpi_phdr;
    d->info.dlpi_phnum = info->dlpi_phnum;
    direct_copy(d->name, info->dlpi_name);
    d->soname[0] = '\0';
    struct client_elfobj o;
    if (client_elfobj_init(&o, info) < 0)
        return 0;
    d->self = client_elfobj_contains(&o, (uintptr_t)&client_direct_init);
    const Elf64_Dyn *dyn = direct_dynamic(info);
    for (; dyn && dyn->d_tag != DT_NULL; dyn++)
        if (dyn->d_tag == DT_SONAME && dyn->d_un.d_val < o.strsz)
            direct_copy(d->soname, o.strtab + dyn->d_un.d_val);
    return 0;
}

static const char *direct_basename(const char *path)
{
    const char *b = strrchr(path, '/');
    return b ? b + 1 : path;
}

/* Whether the loader would have satisfied DT_NEEDED @needed with @d: by path when it has
 * a slash, else by soname or file name. */
static bool direct_matches(const struct direct_obj *d, const char *needed)
{
    if (strchr(needed, '/'))
        return d->name[0] && strcmp(d->name, needed) == 0;
    return (d->soname[0] && strcmp(d->soname, needed) == 0) ||
           (d->name[0] && strcmp(direct_basename(d->name), needed) == 0);
}

/* Marks the objects loaded at startup: the executable (the loader's first object) and,
 * transitively, the one object each of their DT_NEEDED entries names. An entry that two
 * loaded objects match is ambiguous (a dlopened object with the same name): neither is
 * marked by it. The dynamic sections read are those of marked objects only, which stay
 * mapped. */
static void direct_mark_initial(struct direct_scan *sc)
{
    if (sc->n == 0)
        return;
    sc->objs[0].initial = true;
    /* Marked objects may come before the one naming them: rescan until stable. */
    bool changed = true;
    static bool done[DIRECT_MAX_OBJS];
    memset(done, 0, sizeof(done));
    while (changed) {
        changed = false;
        for (uint32_t k = 0; k < sc->n; k++) {
            struct direct_obj *d = &sc->objs[k];
            if (!d->initial || done[k])
                continue;
            done[k] = true;
            struct client_elfobj o;
            if (client_elfobj_init(&o, &d->info) < 0)
                continue;
            const Elf64_Dyn *dyn = direct_dynamic(&d->info);
            for (; dyn && dyn->d_tag != DT_NULL; dyn++) {
                if (dyn->d_tag != DT_NEEDED || dyn->d_un.d_val >= o.strsz)
                    continue;
                const char *needed = o.strtab + dyn->d_un.d_val;
                if (strnlen(needed, DIRECT_NAME_MAX) >= DIRECT_NAME_MAX)
                    continue;
                uint32_t hits = 0, hit = 0;
                for (uint32_t j = 0; j < sc->n; j++)
                    if (direct_matches(&sc->objs[j], needed)) {
                        hits++;
                        hit = j;
                    }
                if (hits == 1 && !sc->objs[hit].initial) {
                    sc->objs[hit].initial = true;
                    changed = true;
                }
            }
        }
    }
}

/* The malloc-family function (not a C++ operator) named @name whose hook forwards to the
 * allocator's own function, or -1. */
static int direct_fn_of(const char *name)
{
    if (!name || !strchr("acfmprv", name[0]))
        return -1;
    for (int i = 0; i < CLIENT_FN_CXX_NEW; i++) {
        if (strcmp(name, client_fn_names[i]) != 0)
            continue;
        client_fn_t own = client_alloc_own[i];
        /* A fallback, or a bootstrap-aware wrapper (blocks from the bootstrap buffer
         * exist, which only the hooks recognise): the slot keeps the hook. */
        if (!own || atomic_load_explicit(&client_real[i], memory_order_acquire) != own)
            return -1;
        return i;
    }
    return -1;
}

/* True when @cur, the value of JUMP_SLOT number @index of @o, is where lazy binding left
 * it: the PLT entry's `push $index` (after an `endbr64` with IBT PLTs), which jumps to the
 * resolver. Anything else in the object is a definition the slot was bound to (a
 * DT_SYMBOLIC object's own function, say), which must stay. */
static bool direct_is_lazy(const struct client_elfobj *o, uintptr_t cur, size_t index)
{
    if (!client_elfobj_contains(o, cur) || cur + 9 > o->hi || index > UINT32_MAX)
        return false;
    const unsigned char *c = (const unsigned char *)cur;
    if (c[0] == 0xf3 && c[1] == 0x0f && c[2] == 0x1e && c[3] == 0xfa)
        c += 4;
    uint32_t imm;
    memcpy(&imm, c + 1, sizeof(imm));
    return c[0] == 0x68 && imm == (uint32_t)index;
}

/* Records the JUMP_SLOT slots of object @d to switch. */
static void direct_record_obj(const struct direct_obj *d)
{
    struct client_elfobj o;
    if (client_elfobj_init(&o, &d->info) < 0)
        return;
    int relro_ok = -1; /* unknown until a slot lies in the RELRO pages */
    uint32_t relro = UINT32_MAX;
    for (size_t i = 0; i < o.n_jmprel && direct_n < CLIENT_DIRECT_MAX_SLOTS; i++) {
        const Elf64_Rela *r = &o.jmprel[i];
        if (ELF64_R_TYPE(r->r_info) != R_X86_64_JUMP_SLOT)
            continue;
        int fn = direct_fn_of(client_elfobj_reloc_name(&o, r));
        if (fn < 0)
            continue;
        uintptr_t addr = o.bias + r->r_offset;
        if (addr < o.lo || addr + sizeof(uintptr_t) > o.hi || addr % sizeof(uintptr_t) != 0)
            continue;
        _Atomic uintptr_t *slot = (_Atomic uintptr_t *)addr;
        uintptr_t cur = atomic_load_explicit(slot, memory_order_relaxed);
        uintptr_t lazy = 0;
        if (cur != (uintptr_t)client_hook_fns[fn]) {
            /* Bound to someone else (another interposer, the allocator itself): not ours. */
            if (!direct_is_lazy(&o, cur, i))
                continue;
            lazy = cur;
        }
        bool in_relro = addr >= o.relro_lo && addr < o.relro_hi;
        if (in_relro && relro_ok < 0)
            relro_ok = client__page_readonly(o.relro_lo);
        if (in_relro && !relro_ok)
            continue; /* not protected (yet?): left alone */
        if (in_relro && relro == UINT32_MAX) {
            if (direct_n_relro == DIRECT_MAX_RELRO)
                return;
            relro = direct_n_relro;
            direct_relro[relro].lo = o.relro_lo;
            direct_relro[relro].hi = o.relro_hi;
            direct_n_relro++;
        }
        direct_slots[direct_n++] = (struct direct_slot){
            .slot = slot,
            .lazy = lazy,
            .fn = (uint16_t)fn,
            .relro = (uint16_t)(in_relro ? relro : UINT16_MAX),
        };
    }
}

void client_direct_init(void)
{
    static bool once;
    if (once || client__direct_disabled)
        return;
    once = true;
    /* Acquire pairs with the release store of the route: client_alloc_own is complete. */
    if (atomic_load_explicit(&client_alloc_route, memory_order_acquire) != CLIENT_ROUTE_EXPORTS ||
        client_alloc_cxx)
        return;
    size_t bytes = HP_ALIGN_UP(sizeof(struct direct_obj) * DIRECT_MAX_OBJS, (size_t)4096);
    struct direct_scan sc = {0};
    sc.objs = hp_sys_mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (hp_sys_failed((long)sc.objs))
        return;
    (void)dl_iterate_phdr(direct_scan_cb, &sc);
    if (!sc.overflow) {
        direct_mark_initial(&sc);
        for (uint32_t k = 0; k < sc.n; k++)
            if (sc.objs[k].initial && !sc.objs[k].self)
                direct_record_obj(&sc.objs[k]);
    }
    (void)hp_sys_munmap(sc.objs, bytes);
    /* Slots not in RELRO first got the index UINT16_MAX: "none" is direct_n_relro. */
    for (uint32_t i = 0; i < direct_n; i++)
        if (direct_slots[i].relro == UINT16_MAX)
            direct_slots[i].relro = (uint16_t)direct_n_relro;
    atomic_store_explicit(&client_stat_direct_slots, direct_n, memory_order_relaxed);
    if (direct_n == 0)
        return;

    direct_lock_take();
    atomic_store_explicit(&direct_ready, true, memory_order_release);
    /* seq_cst: pairs with the seq_cst store of NULL when a session ends. */
    if (!direct_held && !atomic_load_explicit(&client_current, memory_order_seq_cst))
        direct_apply_locked(true);
    direct_lock_drop();
}
