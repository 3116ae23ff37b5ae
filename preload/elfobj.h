/* preload/elfobj.h: reading the dynamic section of an object the loader has mapped, for
 * finding the allocator (preload/alloc.c) and patching GOT slots (preload/got.c).
 *
 * Everything is read from the process's own memory, as the loader left it: no file is
 * opened, nothing is allocated, no lock is taken (the caller gets @info from
 * dl_iterate_phdr, which holds the loader's lock while the object cannot go away).
 *
 *     struct client_elfobj o;
 *     if (client_elfobj_init(&o, info) == 0 && (f = client_elfobj_lookup(&o, "malloc")))
 *         use(f);
 *
 * Hook-safe. x86_64 only (RELA relocations).
 */
#ifndef HP_PRELOAD_ELFOBJ_H
#define HP_PRELOAD_ELFOBJ_H

#include <elf.h>
#include <link.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/macros.h"

#pragma GCC visibility push(hidden)

struct client_elfobj {
    uintptr_t bias;             /* load bias (dlpi_addr) */
    uintptr_t lo, hi;           /* extent of the PT_LOAD segments */
    uintptr_t exec_lo, exec_hi; /* the first executable one (lo == hi: none) */
    const Elf64_Sym *symtab;
    const char *strtab;
    size_t strsz;
    const uint32_t *gnu_hash;  /* DT_GNU_HASH, or NULL */
    const uint32_t *sysv_hash; /* DT_HASH, or NULL */
    const Elf64_Half *versym;  /* DT_VERSYM, or NULL */
    /* Relocations: DT_RELA (GLOB_DAT among others) and DT_JMPREL (JUMP_SLOT). */
    const Elf64_Rela *rela;
    size_t n_rela;
    const Elf64_Rela *jmprel;
    size_t n_jmprel;
    /* Pages the loader made read-only after relocating (PT_GNU_RELRO), page-aligned as
     * the loader protects them; lo == hi: none. */
    uintptr_t relro_lo, relro_hi;
};

/* Reads the object described by @info. Returns 0, or -ENOENT when it has no dynamic
 * section or symbol table (the vDSO's is read, but nothing we look for is in it). */
int client_elfobj_init(struct client_elfobj *o, const struct dl_phdr_info *info) HP_WARN_UNUSED;

/* True when @addr lies in one of the object's PT_LOAD segments' extent. */
static inline bool client_elfobj_contains(const struct client_elfobj *o, uintptr_t addr)
{
    return addr >= o->lo && addr < o->hi;
}

/* The address of function @name as the object defines it (global or weak, default
 * version; an IFUNC is resolved), or NULL when the object does not define it. */
void *client_elfobj_lookup(const struct client_elfobj *o, const char *name);

/* The address of data object @name as the object defines it (global or weak, default
 * version), or NULL. */
void *client_elfobj_lookup_data(const struct client_elfobj *o, const char *name);

/* The name of the symbol relocation @r refers to, or NULL (none, or out of bounds). */
const char *client_elfobj_reloc_name(const struct client_elfobj *o, const Elf64_Rela *r);

#pragma GCC visibility pop

#endif
