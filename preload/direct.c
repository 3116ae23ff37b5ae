/* preload/direct.c: see direct.h. */
#include "preload/direct.h"

#include <elf.h>
#include <fcntl.h>
#include <link.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>

#include "common/macros.h"
#include "common/sys.h"
#include "preload/alloc.h"
#include "preload/client.h"
#include "preload/elfobj.h"
#include "preload/got.h"
#include "preload/slotuse.h"

bool client__direct_disabled;
_Atomic uint32_t client_stat_direct_slots;
_Atomic bool client_stat_direct_on;
_Atomic uint32_t client_stat_direct_unseen;
_Atomic uint64_t client_stat_direct_failures;

/* What a session does with a slot. Late mode records an object's GLOB_DAT slots as
 * DIRECT_USE_UNKNOWN and the first session reads its code to tell (preload/slotuse.h):
 * only a slot used for calls alone is switched; one whose address the code also takes
 * keeps the allocator's, so that `&malloc` keeps one value (its calls are counted as
 * unseen); one used only for its address is not a call path at all. glibc's C library is
 * the exception: its own PLT entries of malloc and free jump through these slots (strdup,
 * fopen... call through them), and the addresses it loads from them it stores to call
 * later (memory streams, callbacks freeing its caches), never to compare: its slots are
 * switched, as LD_PRELOAD would have bound them. */
enum direct_use {
    DIRECT_USE_CALLS,   /* switched (every JUMP_SLOT slot) */
    DIRECT_USE_UNKNOWN, /* a GLOB_DAT slot whose code was not read yet */
    DIRECT_USE_MIXED,   /* calls and address: left, its calls unseen */
    DIRECT_USE_ADDRESS, /* address only (or its object is gone): left */
};

/* A recorded slot: which function, what it held when recorded (kept only when it pointed
 * into its object's PLT: lazy binding), whether it lies in its object's RELRO pages
 * (written through direct_mem, never by a store), its use, and (DIRECT_USE_UNKNOWN) the
 * extent of its object's code. */
struct direct_slot {
    _Atomic uintptr_t *slot;
    uintptr_t lazy;
    uint16_t fn;
    bool relro;
    uint8_t use;
    uintptr_t code_lo, code_hi;
};

/* Written by client_direct_init() before direct_ready is set (release), read-only after;
 * the switching functions read them after an acquire load of direct_ready. */
static struct direct_slot direct_slots[CLIENT_DIRECT_MAX_SLOTS];
static uint32_t direct_n;
static _Atomic bool direct_ready;
/* Loaded into a running program (client__late): the slots hold the allocator's functions
 * at rest and the hooks only while a session holds them; slots of objects loaded later
 * are added by the GOT patcher (client__direct_add_late()), under direct_lock. */
static bool direct_late;

/* Serialises the switches (the constructor against a startup session's thread); held only
 * around a pass over the slots, never while taking another lock. direct_held: a session
 * is open or being opened (under the lock). */
static _Atomic bool direct_lock;
static bool direct_held;

/* /proc/self/mem, open for writing, under direct_lock. RELRO pages are the program's: it
 * may have made them writable for good, or open and close them around its own patches
 * (plthook-style hooks, hot patchers), at any time and under no lock of ours. Changing
 * their protection to write a slot (mprotect RW, write, mprotect R) closed pages the
 * program had opened and raced with its own mprotect calls: either side's write could
 * fault. The kernel writes through a read-only private mapping for a write to
 * /proc/PID/mem (FOLL_FORCE) without changing the mapping, so no protection ever changes.
 * Opened in the constructor, where a later sandbox or PR_SET_DUMPABLE cannot stop it yet;
 * reopened when the program closed or reused the descriptor (st_dev/st_ino differ) and in
 * a forked child (@pid differs: the file is bound to the memory of the process that
 * opened it, the parent's). */
static struct {
    int fd;
    int pid;
    uint64_t dev, ino;
} direct_mem = {.fd = -1};

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

static bool direct_mem_ours_locked(void)
{
    struct stat st;
    return direct_mem.fd >= 0 && hp_sys2(SYS_fstat, direct_mem.fd, (long)&st) == 0 &&
           (uint64_t)st.st_dev == direct_mem.dev && (uint64_t)st.st_ino == direct_mem.ino;
}

/* The descriptor of this process's memory, opened now if need be; -1 when that fails (no
 * /proc, a non-dumpable process, a sandbox). */
static int direct_mem_fd_locked(void)
{
    int pid = (int)hp_sys0(SYS_getpid);
    bool ours = direct_mem_ours_locked();
    if (ours && direct_mem.pid == pid)
        return direct_mem.fd;
    if (ours)
        (void)hp_sys_close(direct_mem.fd); /* the parent's memory */
    direct_mem.fd = -1;
    long fd = hp_sys4(SYS_openat, AT_FDCWD, (long)"/proc/self/mem", O_RDWR | O_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    fd = client__fd_move_high((int)fd);
    struct stat st;
    if (hp_sys2(SYS_fstat, fd, (long)&st) < 0) {
        (void)hp_sys_close((int)fd);
        return -1;
    }
    direct_mem.fd = (int)fd;
    direct_mem.pid = pid;
    direct_mem.dev = (uint64_t)st.st_dev;
    direct_mem.ino = (uint64_t)st.st_ino;
    return direct_mem.fd;
}

/* Writes @want over @cur into the RELRO slot @s through @fd. The slot is read through @fd
 * first: it must hold @cur, which proves @fd reaches this memory and that the program did
 * not re-point the slot since it was loaded (the compare of the compare-and-swap; the
 * program could still write between the two calls, but a slot of the malloc family in a
 * read-only page is not one it rewrites). The kernel copies the 8 aligned bytes with one
 * memcpy, which other threads calling through the slot meanwhile have not been seen to
 * read half-written (x86_64, with fast short rep movsb too). */
static void direct_mem_write(int fd, const struct direct_slot *s, uintptr_t cur, uintptr_t want)
{
    uintptr_t seen = 0;
    if (fd < 0 ||
        hp_sys4(SYS_pread64, fd, (long)&seen, sizeof(seen), (long)s->slot) != sizeof(seen) ||
        seen != cur)
        return;
    (void)hp_sys4(SYS_pwrite64, fd, (long)&want, sizeof(want), (long)s->slot);
}

bool client__direct_mem_cas(uintptr_t addr, uintptr_t cur, uintptr_t want)
{
    direct_lock_take();
    int fd = direct_mem_fd_locked();
    uintptr_t seen = 0;
    bool ok = false;
    if (fd >= 0 &&
        hp_sys4(SYS_pread64, fd, (long)&seen, sizeof(seen), (long)addr) == sizeof(seen) &&
        seen == cur &&
        hp_sys4(SYS_pwrite64, fd, (long)&want, sizeof(want), (long)addr) == sizeof(want))
        ok = hp_sys4(SYS_pread64, fd, (long)&seen, sizeof(seen), (long)addr) == sizeof(seen) &&
             seen == want;
    direct_lock_drop();
    return ok;
}

/* Writes @want into @s when it holds @from or its lazy value; leaves anything else.
 * Returns false when the slot still holds @from or its lazy value: it could not be
 * written. */
static bool direct_write_slot(const struct direct_slot *s, bool direct, int mem_fd)
{
    uintptr_t hook = (uintptr_t)client_hook_fns[s->fn];
    uintptr_t own = (uintptr_t)client_alloc_own[s->fn];
    uintptr_t want = direct ? own : hook, from = direct ? hook : own;
    uintptr_t cur = 0;
    if (direct_late) {
        /* The object may have been unloaded since: read through /proc/self/mem, which
         * says so (EIO) where a load would fault. */
        if (mem_fd < 0 ||
            hp_sys4(SYS_pread64, mem_fd, (long)&cur, sizeof(cur), (long)s->slot) != sizeof(cur))
            return true; /* gone: nothing to give back */
    } else {
        cur = atomic_load_explicit(s->slot, memory_order_relaxed);
    }
    if (cur == want || (cur != from && (s->lazy == 0 || cur != s->lazy)))
        return true;
    if (s->relro) {
        direct_mem_write(mem_fd, s, cur, want);
        if (hp_sys4(SYS_pread64, mem_fd, (long)&cur, sizeof(cur), (long)s->slot) != sizeof(cur))
            return true;
    } else {
        (void)atomic_compare_exchange_strong_explicit(s->slot, &cur, want, memory_order_relaxed,
                                                      memory_order_relaxed);
        cur = atomic_load_explicit(s->slot, memory_order_relaxed);
    }
    return cur != from && (s->lazy == 0 || cur != s->lazy);
}

/* Reads the code of @s's object (through @mem_fd: it may have been unloaded) to tell how
 * it uses the GLOB_DAT slot @s. */
static void direct_classify(struct direct_slot *s, int mem_fd)
{
    struct slotuse u = {0};
    uintptr_t slot = (uintptr_t)s->slot;
    if (mem_fd < 0 || !client_slotuse_of_range(s->code_lo, s->code_hi, mem_fd, &slot, 1, &u))
        s->use = DIRECT_USE_ADDRESS; /* gone, or unreadable: nothing to switch */
    else if (u.others > 0)
        s->use = u.calls > 0 ? DIRECT_USE_MIXED : DIRECT_USE_ADDRESS;
    else
        s->use = u.calls > 0 ? DIRECT_USE_CALLS : DIRECT_USE_ADDRESS;
}

/* One pass over every recorded slot; no protection changes. A slot that cannot be written
 * keeps what it holds: towards direct, the hook (the calls are seen, at the hook's cost);
 * towards the hooks, the allocator's own function, whose calls the session does not see:
 * counted in client_stat_direct_unseen. */
static void direct_apply_locked(bool direct)
{
    int mem_fd = -1;
    bool mem_tried = false;
    uint32_t failed = 0, now_direct = 0;
    for (uint32_t i = 0; i < direct_n; i++) {
        struct direct_slot *s = &direct_slots[i];
        if ((s->relro || direct_late) && !mem_tried) {
            mem_fd = direct_mem_fd_locked();
            mem_tried = true;
        }
        if (s->use == DIRECT_USE_UNKNOWN)
            direct_classify(s, mem_fd);
        if (s->use == DIRECT_USE_ADDRESS)
            continue;
        if (s->use == DIRECT_USE_CALLS && !direct_write_slot(s, direct, mem_fd))
            failed++;
        uintptr_t cur = 0;
        if (direct_late)
            (void)hp_sys4(SYS_pread64, mem_fd, (long)&cur, sizeof(cur), (long)s->slot);
        else
            cur = atomic_load_explicit(s->slot, memory_order_relaxed);
        if (cur == (uintptr_t)client_alloc_own[s->fn])
            now_direct++;
    }
    atomic_fetch_add_explicit(&client_stat_direct_failures, failed, memory_order_relaxed);
    atomic_store_explicit(&client_stat_direct_unseen, direct ? 0 : now_direct,
                          memory_order_relaxed);
    atomic_store_explicit(&client_stat_direct_on, now_direct > 0, memory_order_relaxed);
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
     * here. The pass below opens the child's own /proc/self/mem. */
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

/* Records the JUMP_SLOT slots of object @d to switch; those in its RELRO pages only when
 * @mem (/proc/self/mem opened: without it they keep the hooks, and their calls cost what
 * a session's do). */
static void direct_record_obj(const struct direct_obj *d, bool mem)
{
    struct client_elfobj o;
    if (client_elfobj_init(&o, &d->info) < 0)
        return;
    int relro_ok = mem ? -1 : 0; /* unknown until a slot lies in the RELRO pages */
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
            continue; /* not protected (yet?), or no way to write it: left alone */
        direct_slots[direct_n++] = (struct direct_slot){
            .slot = slot,
            .lazy = lazy,
            .fn = (uint16_t)fn,
            .relro = in_relro,
        };
    }
}

/* The function of the slot of @name in late mode: the malloc family, and the C++
 * operators when the allocator defines them (as the GOT route hooks them), or -1. */
static int direct_late_fn_of(const char *name)
{
    if (!name)
        return -1;
    int from = 0, to = CLIENT_FN_CXX_NEW;
    if (name[0] == '_') {
        if (!client_alloc_cxx || name[1] != 'Z')
            return -1;
        from = CLIENT_FN_CXX_NEW;
        to = CLIENT_N_FN;
    } else if (!strchr("acfmprv", name[0])) {
        return -1;
    }
    for (int i = from; i < to; i++)
        if (strcmp(name, client_fn_names[i]) == 0)
            return client_alloc_own[i] && client_hook_fns[i] ? i : -1;
    return -1;
}

/* Records the JUMP_SLOT and GLOB_DAT slots of @info that hold the allocator's function
 * (or, lazily bound, point into the object's PLT); every one is written through
 * /proc/self/mem (an object can be unloaded between two sessions). Which GLOB_DAT slots
 * are switched the first session decides (direct_classify): reading the code here would
 * lengthen the stop of the thread that loads the library. */
static int direct_late_cb(struct dl_phdr_info *info, size_t size, void *arg)
{
    (void)size;
    (void)arg;
    const char *name = info->dlpi_name ? info->dlpi_name : "";
    const char *base = direct_basename(name);
    /* Not the loader (its allocations go through its own pointers), not the vDSO. */
    if (strncmp(base, "ld-linux", 8) == 0 || strncmp(base, "linux-vdso", 10) == 0)
        return 0;
    struct client_elfobj o;
    if (client_elfobj_init(&o, info) < 0 ||
        client_elfobj_contains(&o, (uintptr_t)&client_direct_init))
        return 0;
    /* The allocator's own calls to itself stay its own, unless it is glibc's C library,
     * whose calls from strdup, fopen... LD_PRELOAD would have seen (by its name:
     * tcmalloc defines __libc_malloc too). */
    bool libc = strcmp(base, "libc.so.6") == 0;
    if (client_elfobj_contains(&o, (uintptr_t)client_alloc_own[CLIENT_FN_MALLOC]) && !libc)
        return 0;
    for (int pass = 0; pass < 2; pass++) {
        const Elf64_Rela *rel = pass == 0 ? o.jmprel : o.rela;
        size_t n = pass == 0 ? o.n_jmprel : o.n_rela;
        for (size_t i = 0; i < n && direct_n < CLIENT_DIRECT_MAX_SLOTS; i++) {
            const Elf64_Rela *r = &rel[i];
            unsigned type = ELF64_R_TYPE(r->r_info);
            if (type != R_X86_64_JUMP_SLOT && type != R_X86_64_GLOB_DAT)
                continue;
            int fn = direct_late_fn_of(client_elfobj_reloc_name(&o, r));
            if (fn < 0)
                continue;
            uintptr_t addr = o.bias + r->r_offset;
            if (addr < o.lo || addr + sizeof(uintptr_t) > o.hi || addr % sizeof(uintptr_t) != 0)
                continue;
            _Atomic uintptr_t *slot = (_Atomic uintptr_t *)addr;
            uintptr_t cur = atomic_load_explicit(slot, memory_order_relaxed);
            uintptr_t lazy = 0;
            if (cur != (uintptr_t)client_alloc_own[fn]) {
                /* Someone else's (another interposer), or a weak undefined 0: left. */
                if (type != R_X86_64_JUMP_SLOT || !direct_is_lazy(&o, cur, i))
                    continue;
                lazy = cur;
            }
            direct_slots[direct_n++] = (struct direct_slot){
                .slot = slot,
                .lazy = lazy,
                .fn = (uint16_t)fn,
                .relro = true,
                .use = type == R_X86_64_GLOB_DAT && !libc ? DIRECT_USE_UNKNOWN : DIRECT_USE_CALLS,
                .code_lo = o.exec_lo,
                .code_hi = o.exec_hi,
            };
        }
    }
    return 0;
}

bool client__direct_add_late(uintptr_t addr, int fn, uintptr_t was)
{
    if (!direct_late)
        return false;
    bool added = false;
    direct_lock_take();
    if (direct_n < CLIENT_DIRECT_MAX_SLOTS) {
        uintptr_t own = (uintptr_t)client_alloc_own[fn];
        direct_slots[direct_n++] = (struct direct_slot){.slot = (_Atomic uintptr_t *)addr,
                                                        .lazy = was == own ? 0 : was,
                                                        .fn = (uint16_t)fn,
                                                        .relro = true};
        added = true;
        atomic_store_explicit(&client_stat_direct_slots, direct_n, memory_order_relaxed);
    }
    direct_lock_drop();
    return added;
}

/* Late mode: every slot of every loaded object, left as it is (dormant: the allocator's).
 * /proc/self/mem is opened by the first session, not here: this runs inside the dlopen of
 * a thread heapprof attach has stopped, and moving a descriptor to 1024 and up in a
 * process with several threads waits for an RCU grace period (7-13 ms of that stop). A
 * session that cannot open it sees none of these calls (counted as unseen). */
static void direct_init_late(void)
{
    direct_late = true;
    (void)dl_iterate_phdr(direct_late_cb, NULL);
    atomic_store_explicit(&client_stat_direct_slots, direct_n, memory_order_relaxed);
    atomic_store_explicit(&direct_ready, true, memory_order_release);
}

void client_direct_init(void)
{
    static bool once;
    if (once || client__direct_disabled)
        return;
    once = true;
    if (client__late) {
        direct_init_late();
        return;
    }
    /* Acquire pairs with the release store of the route: client_alloc_own is complete. */
    if (atomic_load_explicit(&client_alloc_route, memory_order_acquire) != CLIENT_ROUTE_EXPORTS ||
        client_alloc_cxx)
        return;
    size_t bytes = HP_ALIGN_UP(sizeof(struct direct_obj) * DIRECT_MAX_OBJS, (size_t)4096);
    struct direct_scan sc = {0};
    sc.objs = hp_sys_mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (hp_sys_failed((long)sc.objs))
        return;
    direct_lock_take();
    bool mem = direct_mem_fd_locked() >= 0;
    direct_lock_drop();
    (void)dl_iterate_phdr(direct_scan_cb, &sc);
    if (!sc.overflow) {
        direct_mark_initial(&sc);
        for (uint32_t k = 0; k < sc.n; k++)
            if (sc.objs[k].initial && !sc.objs[k].self)
                direct_record_obj(&sc.objs[k], mem);
    }
    (void)hp_sys_munmap(sc.objs, bytes);
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
