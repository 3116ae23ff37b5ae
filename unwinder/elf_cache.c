/* unwinder/elf_cache.c: the ELF cache of elf_cache.h: the table of entries (lookup,
 * references, least-recently-used eviction), the building of an entry from its file
 * (PT_LOADs, .eh_frame_hdr, build id; the symbols come from elf_symbols.c), and the
 * SIGBUS-safe reads of the mapped images.
 */
#include "unwinder/elf_cache.h"

#include <elf.h>
#include <elfutils/libdwelf.h>
#include <errno.h>
#include <fcntl.h>
#include <gelf.h>
#include <libelf.h>
#include <limits.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <ucontext.h>
#include <unistd.h>

#include "unwinder/unwinder_internal.h"

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/lsan_interface.h>
#endif

/* Files larger than this are not mapped (debug builds of browsers reach a few GiB). */
#define ELF_MAX_FILE_BYTES (16ull << 30)

#define NBUCKETS 4096

/* Guards the table, the entries' refs and last_use, and the counters. */
static pthread_mutex_t c_lock = PTHREAD_MUTEX_INITIALIZER;
static struct unwinder__elf *c_buckets[NBUCKETS];
static size_t c_count;   /* entries in the table */
static uint64_t c_clock; /* ticks of unwinder__elf_put(), for least-recently-used order */
static uint64_t c_page_size = 4096;

size_t unwinder__elf_cache_max = UNWINDER_ELF_CACHE_MAX;

/* ---- SIGBUS-safe reads of the mapped files ------------------------------------------ */

/* Copies @len bytes from @src (inside a mapped image) to @dst; returns 0, or -EFAULT when
 * reading @src faulted: a mapped file truncated behind our back raises SIGBUS on the
 * pages past its new end, and the handler below then resumes at the fixup label instead
 * of letting the service die. Leaf function without a stack frame, so moving rip to the
 * fixup is all the recovery needed. */
int unwinder__safe_copy(void *dst, const void *src, size_t len);
extern const char unwinder__safe_copy_end[], unwinder__safe_copy_fixup[];
__asm__(".text\n"
        ".p2align 4\n"
        ".globl unwinder__safe_copy\n"
        ".hidden unwinder__safe_copy\n"
        ".type unwinder__safe_copy, @function\n"
        "unwinder__safe_copy:\n"
        "    cmp $8, %rdx\n"
        "    jne 1f\n"
        "    mov (%rsi), %rax\n"
        "    mov %rax, (%rdi)\n"
        "    xor %eax, %eax\n"
        "    ret\n"
        "1:  mov %rdx, %rcx\n"
        "    rep movsb\n"
        "    xor %eax, %eax\n"
        "    ret\n"
        ".globl unwinder__safe_copy_fixup\n"
        ".hidden unwinder__safe_copy_fixup\n"
        "unwinder__safe_copy_fixup:\n"
        "    mov $-14, %eax\n" /* -EFAULT */
        "    ret\n"
        ".globl unwinder__safe_copy_end\n"
        ".hidden unwinder__safe_copy_end\n"
        "unwinder__safe_copy_end:\n"
        ".size unwinder__safe_copy, .-unwinder__safe_copy\n");
_Static_assert(EFAULT == 14, "the fixup returns -EFAULT");

static struct sigaction c_old_bus;

/* A guarded call of unwinder__bus_guarded(), innermost first on this thread. */
struct bus_guard {
    sigjmp_buf env;
    struct bus_guard *prev;
    uintptr_t addr; /* the faulting address, set by the handler */
};
static _Thread_local struct bus_guard *t_guard;
static atomic_ulong c_bus_faults; /* relaxed: a statistic */

unsigned long unwinder__bus_faults(void)
{
    return atomic_load_explicit(&c_bus_faults, memory_order_relaxed);
}

static void on_sigbus(int sig, siginfo_t *si, void *ctx)
{
    ucontext_t *uc = ctx;
    uintptr_t ip = (uintptr_t)uc->uc_mcontext.gregs[REG_RIP];
    if (ip >= (uintptr_t)unwinder__safe_copy && ip < (uintptr_t)unwinder__safe_copy_end) {
        atomic_fetch_add_explicit(&c_bus_faults, 1, memory_order_relaxed);
        uc->uc_mcontext.gregs[REG_RIP] = (greg_t)(uintptr_t)unwinder__safe_copy_fixup;
        return;
    }
    /* Inside libelf or libdw reading a mapped file for a guarded call: abandon the call.
     * The thread set t_guard itself, so its TLS is allocated; siglongjmp restores the
     * mask saved by sigsetjmp, which has SIGBUS unblocked. */
    struct bus_guard *g = t_guard;
    if (g && si->si_code != SI_USER && si->si_code != SI_TKILL) {
        t_guard = g->prev;
        g->addr = (uintptr_t)si->si_addr;
        atomic_fetch_add_explicit(&c_bus_faults, 1, memory_order_relaxed);
        siglongjmp(g->env, 1);
    }
    /* Not ours: the previous disposition decides. Returning re-executes the faulting
     * instruction, which then gets the default action. */
    if ((c_old_bus.sa_flags & SA_SIGINFO) && c_old_bus.sa_sigaction) {
        c_old_bus.sa_sigaction(sig, si, ctx);
    } else if (c_old_bus.sa_handler != SIG_DFL && c_old_bus.sa_handler != SIG_IGN) {
        c_old_bus.sa_handler(sig);
    } else {
        struct sigaction dfl;
        memset(&dfl, 0, sizeof(dfl));
        dfl.sa_handler = SIG_DFL;
        (void)sigaction(SIGBUS, &dfl, NULL);
    }
}

void unwinder__elf_cache_catch_sigbus(void)
{
    pthread_mutex_lock(&c_lock);
    struct sigaction cur;
    if (sigaction(SIGBUS, NULL, &cur) == 0 &&
        !((cur.sa_flags & SA_SIGINFO) && cur.sa_sigaction == on_sigbus)) {
        struct sigaction sa;
        memset(&sa, 0, sizeof(sa));
        sa.sa_sigaction = on_sigbus;
        sa.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_RESTART;
        sigemptyset(&sa.sa_mask);
        (void)sigaction(SIGBUS, &sa, &c_old_bus);
    }
    pthread_mutex_unlock(&c_lock);
}

int unwinder__elf_cache_init(void)
{
    if (elf_version(EV_CURRENT) == EV_NONE)
        return -ENOTSUP;
    long ps = sysconf(_SC_PAGESIZE);
    if (ps > 0 && (ps & (ps - 1)) == 0)
        c_page_size = (uint64_t)ps;
    /* Process-wide and kept: it only acts on faults inside unwinder__safe_copy(). */
    unwinder__elf_cache_catch_sigbus();
    return 0;
}

/* What a guarded call allocates may be abandoned, unreachable, by a fault: by design, not
 * a leak to report (the leak checker of sanitizer builds is told to ignore this thread's
 * allocations for the call's duration, on both ways out). */
#if defined(__SANITIZE_ADDRESS__)
#define GUARD_LSAN_DISABLE() __lsan_disable()
#define GUARD_LSAN_ENABLE() __lsan_enable()
#else
#define GUARD_LSAN_DISABLE() ((void)0)
#define GUARD_LSAN_ENABLE() ((void)0)
#endif

int unwinder__bus_guarded(int (*fn)(void *arg), void *arg, uintptr_t *ret_addr)
{
    struct bus_guard g = {.prev = t_guard, .addr = 0};
    GUARD_LSAN_DISABLE();
    if (sigsetjmp(g.env, 1) != 0) {
        /* The handler popped the guard. */
        GUARD_LSAN_ENABLE();
        if (ret_addr)
            *ret_addr = g.addr;
        return -EFAULT;
    }
    t_guard = &g;
    int r = fn(arg);
    t_guard = g.prev;
    GUARD_LSAN_ENABLE();
    return r;
}

void unwinder__elf_mark_faulted(const struct unwinder__elf *ce)
{
    struct unwinder__elf *e = (struct unwinder__elf *)(uintptr_t)ce;
    atomic_store_explicit(&e->faulted, true, memory_order_relaxed);
}

static ssize_t entry_bytes(const struct unwinder__elf *e)
{
    return (ssize_t)(sizeof(*e) + e->n_syms * sizeof(*e->syms) + e->image_size);
}

static void entry_free(struct unwinder__elf *e)
{
    if (!e)
        return;
    unwinder__cfi_free(e);
    if (e->image)
        (void)munmap((void *)e->image, e->image_size);
    free(e->syms);
    free(e);
}

void unwinder__elf_cache_done(void)
{
    pthread_mutex_lock(&c_lock);
    for (size_t i = 0; i < NBUCKETS; i++) {
        struct unwinder__elf *e = c_buckets[i];
        while (e) {
            struct unwinder__elf *next = e->next;
            entry_free(e);
            e = next;
        }
        c_buckets[i] = NULL;
    }
    c_count = 0;
    pthread_mutex_unlock(&c_lock);
}

static size_t bucket_of(uint64_t dev, uint64_t inode, const char *path)
{
    uint64_t h = inode ? (dev * 0x9e3779b97f4a7c15ull) ^ (inode * 0xc2b2ae3d27d4eb4full)
                       : (uint64_t)(uintptr_t)path * 0x9e3779b97f4a7c15ull;
    h ^= h >> 31;
    return (size_t)(h % NBUCKETS);
}

static struct unwinder__elf *find_locked(uint64_t dev, uint64_t inode, const char *path)
{
    for (struct unwinder__elf *e = c_buckets[bucket_of(dev, inode, path)]; e; e = e->next) {
        if (inode ? (e->dev == dev && e->inode == inode) : (e->inode == 0 && e->path == path))
            return e;
    }
    return NULL;
}

/* ---- .eh_frame_hdr ------------------------------------------------------------- */

#define DW_EH_PE_omit 0xff
#define DW_EH_PE_datarel_sdata4 0x3b

/* Size of a fixed-size DWARF pointer encoding, or 0 if variable-size or unknown. */
static size_t enc_size(uint8_t enc)
{
    switch (enc & 0x0f) {
    case 0x00: /* absptr */
    case 0x04: /* udata8 */
    case 0x0c: /* sdata8 */
        return 8;
    case 0x02: /* udata2 */
    case 0x0a: /* sdata2 */
        return 2;
    case 0x03: /* udata4 */
    case 0x0b: /* sdata4 */
        return 4;
    default:
        return 0;
    }
}

/* Checks the header at [hdr, hdr+len) and finds its binary-search table. Layout: version,
 * eh_frame_ptr_enc, fde_count_enc, table_enc, eh_frame_ptr, fde_count, table. */
static bool parse_eh_hdr(const uint8_t *hdr, uint64_t len, uint64_t *ret_table_off,
                         uint64_t *ret_count)
{
    if (len < 4 || hdr[0] != 1 || hdr[3] != DW_EH_PE_datarel_sdata4)
        return false;
    uint8_t ptr_enc = hdr[1], count_enc = hdr[2];
    size_t ptr_size = ptr_enc == DW_EH_PE_omit ? 0 : enc_size(ptr_enc);
    if (ptr_enc != DW_EH_PE_omit && ptr_size == 0)
        return false;
    /* The count must be a plain (absolute) unsigned number. */
    size_t count_size = enc_size(count_enc);
    if (count_enc == DW_EH_PE_omit || count_size == 0 || (count_enc & 0x70) != 0)
        return false;
    uint64_t off = 4 + ptr_size;
    if (off + count_size > len)
        return false;
    uint64_t count = 0;
    for (size_t i = 0; i < count_size; i++)
        count |= (uint64_t)hdr[off + i] << (8 * i);
    if ((count_enc & 0x08) && count_size < 8 && (count >> (8 * count_size - 1)))
        return false; /* negative signed count */
    off += count_size;
    if (count > (len - off) / 8)
        return false;
    *ret_table_off = off;
    *ret_count = count;
    return true;
}

/* ---- entries ------------------------------------------------------------------ */

static bool has_suffix(const char *s, size_t len, const char *suffix)
{
    size_t sl = strlen(suffix);
    return len >= sl && memcmp(s + len - sl, suffix, sl) == 0;
}

/* The libelf part of build(), run under unwinder__bus_guarded(): a truncation of the file
 * while libelf reads it through its own mapping abandons it (and leaks its Elf). */
struct parse_args {
    struct unwinder__elf *e;
    int fd;
};

static int parse(void *arg)
{
    struct parse_args *a = arg;
    struct unwinder__elf *e = a->e;
    size_t size = e->image_size;
    int r = 0;
    Elf *elf = elf_begin(a->fd, ELF_C_READ_MMAP, NULL);
    if (!elf || elf_kind(elf) != ELF_K_ELF)
        goto out;

    size_t nph;
    if (elf_getphdrnum(elf, &nph) != 0)
        goto out;
    bool have_eh = false, have_bias = false;
    GElf_Phdr eh_ph = {0};
    for (size_t i = 0; i < nph; i++) {
        GElf_Phdr ph;
        if (!gelf_getphdr(elf, (int)i, &ph))
            continue;
        if (ph.p_type == PT_LOAD && e->n_loads < UNWINDER_ELF_MAX_LOADS) {
            struct unwinder__segment s = {.vaddr = ph.p_vaddr,
                                          .memsz = ph.p_memsz,
                                          .offset = ph.p_offset,
                                          .filesz = ph.p_filesz,
                                          .flags = ph.p_flags};
            s.filesz = s.offset > size ? 0 : HP_MIN(s.filesz, size - s.offset);
            if (e->n_loads == 0)
                e->load0_align = ph.p_align;
            e->loads[e->n_loads++] = s;
            if ((ph.p_flags & PF_X) && !have_bias) {
                e->load_bias = ph.p_vaddr - ph.p_offset;
                have_bias = true;
            }
        } else if (ph.p_type == PT_GNU_EH_FRAME && !have_eh) {
            eh_ph = ph;
            have_eh = true;
        }
    }
    if (!have_bias && e->n_loads > 0)
        e->load_bias = e->loads[0].vaddr - e->loads[0].offset;
    if (have_eh && eh_ph.p_offset < size) {
        uint64_t len = HP_MIN(eh_ph.p_filesz, size - eh_ph.p_offset);
        /* The header's fixed part is at most 20 bytes: parse a copy. */
        uint8_t hdr[32] = {0};
        if (unwinder__safe_copy(hdr, e->image + eh_ph.p_offset,
                                (size_t)HP_MIN(len, (uint64_t)sizeof(hdr))) == 0)
            e->has_eh_hdr = parse_eh_hdr(hdr, len, &e->eh_table_off, &e->eh_fde_count);
        e->eh_hdr_vaddr = eh_ph.p_vaddr;
    }

    const void *bid;
    ssize_t bid_len = dwelf_elf_gnu_build_id(elf, &bid);
    if (bid_len > 0) {
        e->build_id_len = (uint32_t)HP_MIN((size_t)bid_len, (size_t)HP_BUILD_ID_MAX);
        memcpy(e->build_id, bid, e->build_id_len);
    }

    size_t shstrndx;
    if (elf_getshdrstrndx(elf, &shstrndx) == 0) {
        Elf_Scn *scn = NULL;
        while ((scn = elf_nextscn(elf, scn)) != NULL) {
            GElf_Shdr sh;
            const char *name =
                gelf_getshdr(scn, &sh) ? elf_strptr(elf, shstrndx, sh.sh_name) : NULL;
            if (name && strcmp(name, ".debug_frame") == 0 && sh.sh_type == SHT_PROGBITS)
                e->has_debug_frame = true;
        }
    }

    r = unwinder__elf_load_symbols(elf, e);
    if (r == 0)
        e->ok = true;
out:
    if (elf)
        elf_end(elf);
    return r;
}

/* Fills @e from the file. Any problem with the file leaves e->ok false (a negative entry);
 * only allocation failures are returned. */
static int build(struct unwinder__elf *e)
{
    size_t plen = strlen(e->path);
    /* A deleted file's path names whatever lives there now, not what was mapped. */
    if (e->path[0] != '/' || has_suffix(e->path, plen, " (deleted)"))
        return 0;
    struct stat st;
    int fd = unwinder__open_file(e->open_path, false, e->inode, &st);
    if (fd < 0)
        return 0;
    int r = 0;
    if (st.st_size < (off_t)sizeof(Elf64_Ehdr) || (uint64_t)st.st_size > ELF_MAX_FILE_BYTES)
        goto out;
    size_t size = (size_t)st.st_size;
    void *img = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (img == MAP_FAILED)
        goto out;
    e->image = img;
    e->image_size = size;

    Elf64_Ehdr eh;
    if (unwinder__safe_copy(&eh, img, sizeof(eh)) < 0)
        goto out;
    if (memcmp(eh.e_ident, ELFMAG, SELFMAG) != 0 || eh.e_ident[EI_CLASS] != ELFCLASS64 ||
        eh.e_ident[EI_DATA] != ELFDATA2LSB || eh.e_machine != EM_X86_64)
        goto out;
    struct parse_args a = {.e = e, .fd = fd};
    r = unwinder__bus_guarded(parse, &a, NULL);
    if (r == -EFAULT) {
        /* Truncated while libelf read it: a negative entry (its partial symbol index, if
         * any, is dropped below with the rest). */
        r = 0;
        e->ok = false;
    }
out:
    (void)close(fd);
    if (!e->ok && e->image) {
        (void)munmap((void *)e->image, e->image_size);
        e->image = NULL;
        e->image_size = 0;
        e->n_loads = 0;
        e->has_eh_hdr = false;
    }
    return r;
}

/* Frees least recently used entries that nobody holds while the table is over its cap. */
static void evict_locked(void)
{
    while (c_count > unwinder__elf_cache_max) {
        struct unwinder__elf **victim = NULL;
        for (size_t b = 0; b < NBUCKETS; b++) {
            for (struct unwinder__elf **pe = &c_buckets[b]; *pe; pe = &(*pe)->next) {
                if ((*pe)->refs == 0 && (!victim || (*pe)->last_use < (*victim)->last_use))
                    victim = pe;
            }
        }
        if (!victim)
            return; /* every entry is in use: over the cap until some are released */
        struct unwinder__elf *e = *victim;
        *victim = e->next;
        c_count--;
        unwinder__account(-entry_bytes(e));
        entry_free(e);
    }
}

void unwinder__elf_ref(const struct unwinder__elf *ce)
{
    struct unwinder__elf *e = (struct unwinder__elf *)(uintptr_t)ce;
    pthread_mutex_lock(&c_lock);
    e->refs++;
    pthread_mutex_unlock(&c_lock);
}

void unwinder__elf_put(const struct unwinder__elf *ce)
{
    if (!ce)
        return;
    struct unwinder__elf *e = (struct unwinder__elf *)ce;
    pthread_mutex_lock(&c_lock);
    if (e->refs > 0)
        e->refs--;
    e->last_use = ++c_clock;
    if (e->refs == 0)
        evict_locked();
    pthread_mutex_unlock(&c_lock);
}

size_t unwinder__elf_cache_count(void)
{
    pthread_mutex_lock(&c_lock);
    size_t n = c_count;
    pthread_mutex_unlock(&c_lock);
    return n;
}

int unwinder__elf_get(uint64_t dev, uint64_t inode, const char *path,
                      const struct unwinder__elf **ret)
{
    return unwinder__elf_get_in(dev, inode, path, NULL, ret);
}

int unwinder__elf_get_in(uint64_t dev, uint64_t inode, const char *path, const char *root,
                         const struct unwinder__elf **ret)
{
    const char *ipath = unwinder__intern(path, strlen(path));
    if (!inode) {
        dev = 0;
        root = NULL; /* keyed by the path: ours only */
    }

    pthread_mutex_lock(&c_lock);
    struct unwinder__elf *found = find_locked(dev, inode, ipath);
    if (found)
        found->refs++;
    pthread_mutex_unlock(&c_lock);
    if (found) {
        *ret = found;
        return 0;
    }

    /* Built outside the lock: parsing a large library takes milliseconds and other
     * unwinder threads should not wait for it. A racing twin is discarded below. */
    struct unwinder__elf *e = calloc(1, sizeof(*e));
    if (!e)
        return -ENOMEM;
    e->dev = dev;
    e->inode = inode;
    e->path = ipath;
    e->open_path = ipath;
    if (root && path[0] == '/') {
        char full[PATH_MAX + 64];
        int n = snprintf(full, sizeof(full), "%s%s", root, path);
        if (n > 0 && (size_t)n < sizeof(full))
            e->open_path = unwinder__intern(full, (size_t)n);
    }
    int r = build(e);
    if (r < 0) {
        entry_free(e);
        return r;
    }

    pthread_mutex_lock(&c_lock);
    found = find_locked(dev, inode, ipath);
    if (!found) {
        size_t b = bucket_of(dev, inode, ipath);
        e->next = c_buckets[b];
        c_buckets[b] = e;
        c_count++;
        unwinder__account(entry_bytes(e));
        found = e;
        e = NULL;
    }
    found->refs++;
    evict_locked();
    pthread_mutex_unlock(&c_lock);
    entry_free(e);
    *ret = found;
    return 0;
}

int unwinder__elf_read(const struct unwinder__elf *e, uint64_t off, void *buf, size_t len)
{
    if (!e->ok)
        return -EFAULT;
    uint64_t mapped_end = HP_ALIGN_UP((uint64_t)e->image_size, c_page_size);
    if (off >= mapped_end || len > mapped_end - off)
        return -EFAULT;
    size_t avail = off < e->image_size ? HP_MIN(len, e->image_size - (size_t)off) : 0;
    if (avail && unwinder__safe_copy(buf, e->image + off, avail) < 0)
        return -EFAULT;
    if (avail < len)
        memset((uint8_t *)buf + avail, 0, len - avail);
    return 0;
}

const struct unwinder__segment *unwinder__elf_segment_for(const struct unwinder__elf *e,
                                                          uint64_t pgoff, uint32_t want_flags)
{
    const struct unwinder__segment *any = NULL;
    if (!e->ok)
        return NULL;
    for (size_t i = 0; i < e->n_loads; i++) {
        const struct unwinder__segment *s = &e->loads[i];
        uint64_t first = s->offset & ~(c_page_size - 1);
        if (s->filesz == 0 || pgoff < first ||
            (pgoff >= s->offset && pgoff - s->offset >= s->filesz))
            continue;
        if ((s->flags & want_flags) == want_flags)
            return s;
        if (!any)
            any = s;
    }
    return any;
}
