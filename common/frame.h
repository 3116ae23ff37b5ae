/* common/frame.h: an unwound frame as the unwinder hands it to bookkeeping.
 *
 * Mappings and function names are immutable, interned objects owned by the unwinder's
 * global state: they stay valid until unwinder_global_done(), so messages between the
 * unwinder threads and the bookkeeping thread can carry plain pointers to them without
 * sharing any mutable state.
 *
 *     for (size_t i = 0; i < n; i++)   // leaf first
 *         printf("%s+%#lx in %s\n", f[i].function_name, f[i].rel_pc, f[i].map->path);
 */
#ifndef HP_COMMON_FRAME_H
#define HP_COMMON_FRAME_H

#include <stdint.h>

#define HP_BUILD_ID_MAX 64

/* One mapping of an ELF file (or anonymous memory) in a target process, as Perfetto's
 * `Mapping` describes it. Immutable once published. */
struct hp_mapping {
    uint64_t start;        /* first address of the mapping in the process */
    uint64_t end;          /* one past the last address */
    uint64_t exact_offset; /* file offset of @start (pgoff from /proc/PID/maps) */
    uint64_t start_offset; /* file offset of the ELF header the mapping belongs to */
    uint64_t load_bias;    /* p_vaddr - p_offset of the executable PT_LOAD */
    const char *path;      /* interned; "" for anonymous memory */
    uint32_t build_id_len; /* 0 when unknown */
    uint8_t build_id[HP_BUILD_ID_MAX];
};

/* One frame. rel_pc is the pc as an ELF virtual address of the mapped file (what a
 * symbolizer looks up), or the absolute pc when @map is NULL. */
struct hp_frame {
    const struct hp_mapping *map; /* NULL: unknown mapping (also for error frames) */
    const char *function_name;    /* interned; "" when unknown; "ERROR <reason>" on error */
    uint64_t rel_pc;
};

/* One source position of the code at a pc: a function, its file and line. A pc in
 * inlined code has several, innermost first: the inlined function at its own line, then
 * each caller at the line of its call, ending with the function the pc belongs to. */
struct hp_source_line {
    const char *function_name; /* "" when unknown */
    const char *file;          /* "" when unknown */
    uint32_t line;             /* 0 when unknown */
};

#endif
