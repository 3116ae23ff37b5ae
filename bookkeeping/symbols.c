/* bookkeeping/symbols.c: source lines of the frames a dump used, as ModuleSymbols
 * packets after the dump. */
#include "bookkeeping/state.h"

#include <errno.h>
#include <pb_encode.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/pbwire.h"
#include "protos/fields.h"
#include "protos/trace_packet.pb.h"

/* ---- source lines: ModuleSymbols packets ---- */

/* The address_symbols of one mapping, as they are collected. */
struct module_syms {
    uint32_t mapping_id;
    struct hp_pbw syms;
};

static int flush_module(bk_t *bk, struct module_syms *ms)
{
    const struct bk_intern *in = &bk->in;
    const struct bk_mapping *m = &in->mappings[ms->mapping_id];
    const struct bk_str *bid = &in->str[BK_STR_BUILD_ID].v[m->build_id];
    struct hp_pbw mod = {0}, pkt = {0};
    hp_pbw_len(&mod, PF_MODULE(path), m->path, m->path_len);
    /* Raw build id bytes, as Perfetto's ModuleSymbols.build_id wants them. */
    if (bid->len)
        hp_pbw_len(&mod, PF_MODULE(build_id), bid->s, bid->len);
    hp_pbw_bytes(&mod, ms->syms.p, ms->syms.len);
    mod.oom |= ms->syms.oom;
    ms->syms.len = 0;
    hp_pbw_uint_always(&pkt, PF_PACKET(timestamp), hp_clock_ns(CLOCK_BOOTTIME));
    if (!bk->has_sink)
        hp_pbw_uint_always(&pkt, PF_PACKET(trusted_packet_sequence_id), bk->sequence_id);
    hp_pbw_msg(&pkt, PF_PACKET(module_symbols), &mod);
    int r = pkt.oom ? -ENOMEM : bk__write_raw_packet(bk, pkt.p, pkt.len);
    free(mod.p);
    free(pkt.p);
    return r;
}

/* Collects into @ret the frames the samples of @p's dump just written use and that were
 * not offered before: the trace processor creates a frame only when it resolves the
 * callstacks of a finished dump, and counts a ModuleSymbols address of any other frame
 * as stackprofile_invalid_frame_id. A dump writes every site of a heap and sites are
 * only appended, so only the sites new since the heap's last dump are walked, each up
 * to the first callstack node already seen. */
static int used_frames(bk_t *bk, struct bk_proc *p, uint32_t **ret, size_t *ret_n)
{
    struct bk_intern *in = &bk->in;
    uint32_t *v = NULL;
    size_t n = 0, cap = 0;
    size_t old_cap = bk->cap_frame_offered;
    if (hp_grow((void **)&bk->frame_offered, &bk->cap_frame_offered, in->n_frames, 1) < 0)
        return -ENOMEM;
    memset(bk->frame_offered + old_cap, 0, bk->cap_frame_offered - old_cap);
    for (size_t i = 0; i < p->n_heaps; i++) {
        struct bk_heap *h = p->heaps[i];
        for (size_t k = h->n_sites_symbolized; k < h->n_sites; k++) {
            for (uint32_t node = h->sites[k].callstack_id; node != 0 && !in->nodes[node].symbolized;
                 node = in->nodes[node].parent) {
                in->nodes[node].symbolized = true;
                uint32_t f = in->nodes[node].frame_id;
                if (bk->frame_offered[f])
                    continue;
                bk->frame_offered[f] = 1;
                if (hp_grow((void **)&v, &cap, n + 1, sizeof(*v)) < 0) {
                    free(v);
                    return -ENOMEM;
                }
                v[n++] = f;
            }
        }
        h->n_sites_symbolized = h->n_sites;
    }
    *ret = v;
    *ret_n = n;
    return 0;
}

/* Lines of one address kept at most (Perfetto's readers expect a few; heapprof's own
 * reader keeps 64). */
#define BK_MAX_LINES_PER_ADDRESS 64

/* Appends to @sym the AddressSymbols of frame @f from @lines (innermost first: the order
 * of Perfetto's AddressSymbols.lines, whose last Line is the frame's own function). The
 * frame's own function is named as the frame is (its ELF symbol), the inlined ones as
 * the DWARF names them. Past BK_MAX_LINES_PER_ADDRESS, the innermost lines and the
 * last are kept. */
static void put_address(const struct bk_intern *in, const struct bk_frame *f,
                        const struct hp_source_line *lines, size_t n, struct hp_pbw *sym,
                        struct hp_pbw *line)
{
    const struct bk_str *own = &in->str[BK_STR_FUNCTION].v[f->function_name_id];
    hp_pbw_uint_always(sym, PF_ADDRESS(address), f->rel_pc);
    for (size_t k = 0; k < n; k++) {
        if (k >= BK_MAX_LINES_PER_ADDRESS - 1 && k != n - 1)
            continue;
        const struct hp_source_line *l = &lines[k];
        const char *name = l->function_name ? l->function_name : "";
        size_t name_len = strnlen(name, BK_MAX_STRING_BYTES);
        if (k == n - 1 && own->len) {
            name = own->s;
            name_len = own->len;
        }
        if (name_len)
            hp_pbw_len(line, PF_LINE(function_name), name, name_len);
        if (l->file && l->file[0])
            hp_pbw_len(line, PF_LINE(source_file_name), l->file,
                       strnlen(l->file, BK_MAX_STRING_BYTES));
        hp_pbw_uint_always(line, PF_LINE(line_number), l->line);
        hp_pbw_msg(sym, PF_ADDRESS(lines), line);
    }
}

/* Appends to @v the frames whose lines an earlier dump was told to ask again for, and
 * forgets them. */
static int take_frames_later(bk_t *bk, uint32_t **v, size_t *n)
{
    if (bk->n_frames_later == 0)
        return 0;
    size_t cap = *n;
    if (hp_grow((void **)v, &cap, *n + bk->n_frames_later, sizeof(**v)) < 0)
        return -ENOMEM;
    memcpy(*v + *n, bk->frames_later, bk->n_frames_later * sizeof(**v));
    *n += bk->n_frames_later;
    bk->n_frames_later = 0;
    return 0;
}

/* Offers the frames @p's dump just used (and no dump used before) and those not ready
 * at an earlier dump to the source_lines callback, and writes what it knows as
 * ModuleSymbols packets, one or more per mapping, each below the packet size bound
 * (unless one address alone is above it). Only @final waits for lines being read: a
 * dump on schedule never waits for a low-priority reader on a busy machine. */
int bk__write_source_lines(bk_t *bk, struct bk_proc *p, bool final)
{
    struct bk_intern *in = &bk->in;
    if (!bk->source_lines)
        return 0;
    uint32_t *frames;
    size_t n_frames;
    int r = used_frames(bk, p, &frames, &n_frames);
    if (r == 0 && (r = take_frames_later(bk, &frames, &n_frames)) < 0)
        free(frames);
    if (r < 0)
        return r;
    struct module_syms *mods = NULL;
    size_t n_mods = 0, cap_mods = 0;
    struct hp_map index; /* mapping id -> index in mods */
    hp_map_init(&index, sizeof(uint64_t));
    struct hp_pbw sym = {0}, line = {0};
    for (size_t i = 0; i < n_frames && r == 0; i++) {
        const struct bk_frame *f = &in->frames[frames[i]];
        const struct hp_source_line *lines = NULL;
        size_t n_lines = 0;
        if (!f->src_map)
            continue;
        int got =
            bk->source_lines(bk->source_lines_ctx, f->src_map, f->rel_pc, final, &lines, &n_lines);
        if (got == -EAGAIN && !final) {
            r = hp_grow((void **)&bk->frames_later, &bk->cap_frames_later, bk->n_frames_later + 1,
                        sizeof(uint32_t));
            if (r == 0)
                bk->frames_later[bk->n_frames_later++] = frames[i];
            continue;
        }
        if (got < 0 || !lines || n_lines == 0)
            continue;
        put_address(in, f, lines, n_lines, &sym, &line);

        uint64_t *slot;
        int put = hp_map_put(&index, f->mapping_id, (void **)&slot);
        if (put < 0) {
            r = put;
            break;
        }
        if (put == 1) {
            r = hp_grow((void **)&mods, &cap_mods, n_mods + 1, sizeof(*mods));
            if (r < 0)
                break;
            mods[n_mods] = (struct module_syms){.mapping_id = f->mapping_id};
            *slot = n_mods++;
        }
        struct module_syms *ms = &mods[*slot];
        /* Room for the path, build id and framing besides the addresses. */
        if (ms->syms.len &&
            ms->syms.len + sym.len + BK_MAX_STRING_BYTES + 256 > bk->max_packet_bytes)
            r = flush_module(bk, ms);
        hp_pbw_msg(&ms->syms, PF_MODULE(address_symbols), &sym);
        bk->counters.source_lines++;
    }
    for (size_t i = 0; i < n_mods; i++) {
        if (r == 0 && (mods[i].syms.len || mods[i].syms.oom))
            r = flush_module(bk, &mods[i]);
        free(mods[i].syms.p);
    }
    free(mods);
    free(sym.p);
    free(line.p);
    hp_map_done(&index);
    free(frames);
    return r;
}
