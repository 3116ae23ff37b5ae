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
    hp_pbw_uint_always(&pkt, PF_PACKET(trusted_packet_sequence_id), bk->sequence_id);
    hp_pbw_msg(&pkt, PF_PACKET(module_symbols), &mod);
    int r = pkt.oom ? -ENOMEM : bk__write_raw_packet(bk, pkt.p, pkt.len);
    free(mod.p);
    free(pkt.p);
    return r;
}

/* Offers the frames written since the last call to the source_line callback and writes
 * what it knows as ModuleSymbols packets, one or more per mapping, each below the packet
 * size bound. */
int bk__write_source_lines(bk_t *bk)
{
    struct bk_intern *in = &bk->in;
    size_t end = bk->emitted_frames;
    if (!bk->source_line || bk->symbolized_frames >= end) {
        bk->symbolized_frames = HP_MAX(bk->symbolized_frames, end);
        return 0;
    }
    struct module_syms *mods = NULL;
    size_t n_mods = 0, cap_mods = 0;
    struct hp_map index; /* mapping id -> index in mods */
    hp_map_init(&index, sizeof(uint64_t));
    struct hp_pbw sym = {0}, line = {0};
    int r = 0;
    for (size_t i = bk->symbolized_frames; i < end && r == 0; i++) {
        const struct bk_frame *f = &in->frames[i];
        const char *file = NULL;
        uint32_t lineno = 0;
        if (!f->src_map ||
            bk->source_line(bk->source_line_ctx, f->src_map, f->rel_pc, &file, &lineno) < 0 ||
            !file)
            continue;
        const struct bk_str *name = &in->str[BK_STR_FUNCTION].v[f->function_name_id];
        if (name->len)
            hp_pbw_len(&line, PF_LINE(function_name), name->s, name->len);
        hp_pbw_len(&line, PF_LINE(source_file_name), file, strnlen(file, BK_MAX_STRING_BYTES));
        hp_pbw_uint_always(&line, PF_LINE(line_number), lineno);
        hp_pbw_uint_always(&sym, PF_ADDRESS(address), f->rel_pc);
        hp_pbw_msg(&sym, PF_ADDRESS(lines), &line);

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
        hp_pbw_msg(&ms->syms, PF_MODULE(address_symbols), &sym);
        bk->counters.source_lines++;
        if (ms->syms.len + 2 * BK_MAX_STRING_BYTES > bk->max_packet_bytes)
            r = flush_module(bk, ms);
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
    bk->symbolized_frames = end;
    return r;
}
