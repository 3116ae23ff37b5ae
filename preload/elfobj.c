/* preload/elfobj.c: see elfobj.h. Hook-safe. */
#include "preload/elfobj.h"

#include <errno.h>
#include <string.h>
#include <unistd.h>

/* The loader rewrites most d_ptr entries of a writable dynamic section to run-time
 * addresses (glibc's elf_get_dynamic_info); a read-only one (the vDSO's) keeps link-time
 * values. A link-time value is below the bias of an object that has one. */
static uintptr_t elfobj_ptr(const struct client_elfobj *o, Elf64_Addr v)
{
    return (o->bias != 0 && v < o->bias) ? o->bias + v : (uintptr_t)v;
}

int client_elfobj_init(struct client_elfobj *o, const struct dl_phdr_info *info)
{
    memset(o, 0, sizeof(*o));
    o->bias = info->dlpi_addr;
    o->lo = UINTPTR_MAX;
    const Elf64_Dyn *dyn = NULL;
    uintptr_t page = (uintptr_t)getpagesize();
    for (unsigned i = 0; i < info->dlpi_phnum; i++) {
        const Elf64_Phdr *ph = &info->dlpi_phdr[i];
        uintptr_t start = o->bias + ph->p_vaddr, end = start + ph->p_memsz;
        if (ph->p_type == PT_LOAD) {
            o->lo = HP_MIN(o->lo, start);
            o->hi = HP_MAX(o->hi, end);
            /* The first executable segment (the only one, as linkers lay objects out):
             * one range read directly has no unmapped hole in it. */
            if ((ph->p_flags & PF_X) && o->exec_hi == 0) {
                o->exec_lo = start;
                o->exec_hi = end;
            }
        } else if (ph->p_type == PT_DYNAMIC) {
            dyn = (const Elf64_Dyn *)start;
        } else if (ph->p_type == PT_GNU_RELRO) {
            /* The loader protects whole pages from the segment's start down to the last
             * page boundary inside it (glibc's _dl_protect_relro). */
            o->relro_lo = start & ~(page - 1);
            o->relro_hi = end & ~(page - 1);
            if (o->relro_hi < o->relro_lo)
                o->relro_hi = o->relro_lo;
        }
    }
    if (!dyn)
        return -ENOENT;
    size_t relasz = 0, jmprelsz = 0, relaent = sizeof(Elf64_Rela);
    Elf64_Sxword pltrel = DT_RELA;
    for (; dyn->d_tag != DT_NULL; dyn++) {
        switch (dyn->d_tag) {
        case DT_SYMTAB:
            o->symtab = (const Elf64_Sym *)elfobj_ptr(o, dyn->d_un.d_ptr);
            break;
        case DT_STRTAB:
            o->strtab = (const char *)elfobj_ptr(o, dyn->d_un.d_ptr);
            break;
        case DT_STRSZ:
            o->strsz = dyn->d_un.d_val;
            break;
        case DT_GNU_HASH:
            o->gnu_hash = (const uint32_t *)elfobj_ptr(o, dyn->d_un.d_ptr);
            break;
        case DT_HASH:
            o->sysv_hash = (const uint32_t *)elfobj_ptr(o, dyn->d_un.d_ptr);
            break;
        case DT_VERSYM:
            o->versym = (const Elf64_Half *)elfobj_ptr(o, dyn->d_un.d_ptr);
            break;
        case DT_RELA:
            o->rela = (const Elf64_Rela *)elfobj_ptr(o, dyn->d_un.d_ptr);
            break;
        case DT_RELASZ:
            relasz = dyn->d_un.d_val;
            break;
        case DT_RELAENT:
            relaent = dyn->d_un.d_val;
            break;
        case DT_JMPREL:
            o->jmprel = (const Elf64_Rela *)elfobj_ptr(o, dyn->d_un.d_ptr);
            break;
        case DT_PLTRELSZ:
            jmprelsz = dyn->d_un.d_val;
            break;
        case DT_PLTREL:
            pltrel = dyn->d_un.d_val;
            break;
        default:
            break;
        }
    }
    if (!o->symtab || !o->strtab)
        return -ENOENT;
    if (relaent != sizeof(Elf64_Rela))
        o->rela = NULL;
    if (pltrel != DT_RELA)
        o->jmprel = NULL;
    o->n_rela = o->rela ? relasz / sizeof(Elf64_Rela) : 0;
    o->n_jmprel = o->jmprel ? jmprelsz / sizeof(Elf64_Rela) : 0;
    return 0;
}

static uint32_t elfobj_gnu_hash(const char *name)
{
    uint32_t h = 5381;
    for (const unsigned char *s = (const unsigned char *)name; *s; s++)
        h = h * 33 + *s;
    return h;
}

static uint32_t elfobj_sysv_hash(const char *name)
{
    uint32_t h = 0;
    for (const unsigned char *s = (const unsigned char *)name; *s; s++) {
        h = (h << 4) + *s;
        uint32_t g = h & 0xf0000000u;
        if (g)
            h ^= g >> 24;
        h &= ~g;
    }
    return h;
}

/* Symbol @i matches @name and is a definition of a function (@data: of a data object)
 * with the default version. */
static void *elfobj_match(const struct client_elfobj *o, uint32_t i, const char *name, bool data)
{
    const Elf64_Sym *s = &o->symtab[i];
    if (s->st_shndx == SHN_UNDEF || s->st_name >= o->strsz ||
        strcmp(o->strtab + s->st_name, name) != 0)
        return NULL;
    unsigned type = ELF64_ST_TYPE(s->st_info), bind = ELF64_ST_BIND(s->st_info);
    bool kind = data ? type == STT_OBJECT : (type == STT_FUNC || type == STT_GNU_IFUNC);
    if (!kind || (bind != STB_GLOBAL && bind != STB_WEAK))
        return NULL;
    /* 0: local; the hidden bit: an old version (e.g. glibc's cfree@GLIBC_2.2.5), which no
     * new reference binds to. */
    if (o->versym && ((o->versym[i] & 0x7fff) == 0 || (o->versym[i] & 0x8000)))
        return NULL;
    void *addr = (void *)(o->bias + s->st_value);
    if (type == STT_GNU_IFUNC)
        addr = ((void *(*)(void))addr)();
    return addr;
}

static void *elfobj_lookup(const struct client_elfobj *o, const char *name, bool data)
{
    if (o->gnu_hash) {
        const uint32_t *h = o->gnu_hash;
        uint32_t nbuckets = h[0], symoffset = h[1], bloom_size = h[2];
        if (nbuckets == 0)
            return NULL;
        const uint32_t *buckets = h + 4 + (size_t)bloom_size * 2; /* 64-bit bloom words */
        const uint32_t *chain = buckets + nbuckets;
        uint32_t hash = elfobj_gnu_hash(name);
        uint32_t i = buckets[hash % nbuckets];
        if (i < symoffset)
            return NULL;
        for (;; i++) {
            uint32_t c = chain[i - symoffset];
            if ((c | 1) == (hash | 1)) {
                void *f = elfobj_match(o, i, name, data);
                if (f)
                    return f;
            }
            if (c & 1)
                return NULL;
        }
    }
    if (o->sysv_hash) {
        uint32_t nbucket = o->sysv_hash[0], nchain = o->sysv_hash[1];
        if (nbucket == 0)
            return NULL;
        const uint32_t *bucket = o->sysv_hash + 2, *chain = bucket + nbucket;
        for (uint32_t i = bucket[elfobj_sysv_hash(name) % nbucket], n = 0;
             i != STN_UNDEF && i < nchain && n < nchain; i = chain[i], n++) {
            void *f = elfobj_match(o, i, name, data);
            if (f)
                return f;
        }
    }
    return NULL;
}

void *client_elfobj_lookup(const struct client_elfobj *o, const char *name)
{
    return elfobj_lookup(o, name, false);
}

void *client_elfobj_lookup_data(const struct client_elfobj *o, const char *name)
{
    return elfobj_lookup(o, name, true);
}

const char *client_elfobj_reloc_name(const struct client_elfobj *o, const Elf64_Rela *r)
{
    uint32_t i = ELF64_R_SYM(r->r_info);
    if (i == STN_UNDEF)
        return NULL;
    Elf64_Word n = o->symtab[i].st_name;
    return n < o->strsz ? o->strtab + n : NULL;
}
