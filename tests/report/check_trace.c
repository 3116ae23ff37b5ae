/* tests/report/check_trace.c: `rp_check_trace FILE...` checks that heap-profile
 * traces follow the rules Perfetto's trace processor imports them by, and prints the
 * first broken rule. Usable on any trace heapprof wrote (the e2e tests' real traces
 * too); here it runs on gen_trace's output.
 *
 * Rules, per trusted_packet_sequence_id, for the packets of profiles (and their interned
 * data, symbols, processes and clocks; a trace traced wrote has others):
 *   - every such packet has a sequence id and a timestamp (but traced's ClockSnapshot,
 *     which holds the times itself); the first packet of a sequence
 *     sets SEQ_INCREMENTAL_STATE_CLEARED; a ClockSnapshot comes before any profile;
 *   - an interned entry is defined once, and every id a packet refers to (build ids and
 *     path components of mappings, names and mappings of frames, frames of callstacks,
 *     callstacks of samples) is defined in that packet or before it;
 *   - ProfilePacket.index counts 0, 1, 2, ... without gaps, from 0 again after each
 *     SEQ_INCREMENTAL_STATE_CLEARED (as the trace processor does); a dump ends with
 *     continued = false, and the file does not end inside one;
 *   - per (pid, heap, callstack), the cumulative self_allocated, self_freed,
 *     alloc_count and free_count never decrease from one dump to the next, and freed
 *     never exceeds allocated;
 *   - a later packet with SEQ_INCREMENTAL_STATE_CLEARED starts the sequence's interned
 *     tables afresh: ids defined before it no longer count;
 *   - every address of a ModuleSymbols packet that carries lines names a frame (same
 *     mapping path and build id, rel_pc == address) that a complete dump earlier in the
 *     file used in one of its samples' callstacks: the trace processor creates frames only
 *     when it resolves a finished dump's callstacks, and counts any other address as
 *     stackprofile_invalid_frame_id.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/containers.h"
#include "common/pbwire.h"
#include "protos/fields.h"

/* Every interned entry has its iid in the same field. */
#define IID PF_STRING(iid)
_Static_assert(PF_MAPPING(iid) == IID && PF_FRAME(iid) == IID && PF_CALLSTACK(iid) == IID,
               "one iid field for every table");
/* The InternedData tables checked: the fields below this one. */
#define N_TABLES (PF_INTERNED(mappings) + 1)

/* An interned entry: where its message lies in the file (which stays in memory). */
struct entry {
    const uint8_t *p;
    size_t len;
};

struct seq {
    uint32_t id;
    struct hp_map defined[N_TABLES]; /* by InternedData field number: iid -> struct entry */
    struct hp_map dump_callstacks;   /* callstack iids the current dump's samples use */
    uint64_t next_index;
    bool in_dump;
};

struct checker {
    const char *path;
    struct seq seqs[8];
    size_t n_seqs;
    bool clock;
    struct hp_map cumulative;  /* hash(pid, heap, callstack) -> 4 values */
    struct hp_map used_frames; /* hash(path, build id, rel_pc) of frames complete dumps used */
    uint64_t packets, profiles, dumps;
};

#define FAIL(c, ...)                                                                               \
    do {                                                                                           \
        fprintf(stderr, "%s: packet %llu: ", (c)->path, (unsigned long long)(c)->packets);         \
        fprintf(stderr, __VA_ARGS__);                                                              \
        fputc('\n', stderr);                                                                       \
        return false;                                                                              \
    } while (0)

static uint64_t varint_field(const uint8_t *p, size_t len, uint32_t num, uint64_t dflt)
{
    struct hp_pb_iter it;
    struct hp_pb_field f;
    hp_pb_iter_init(&it, p, len);
    while (hp_pb_next(&it, &f))
        if (f.num == num && f.wire_type == HP_PB_VARINT)
            dflt = f.varint;
    return dflt;
}

static bool is_defined(struct seq *s, uint32_t table, uint64_t iid)
{
    return hp_map_get(&s->defined[table], iid) != NULL;
}

/* Checks the references of one interned entry or sample, each id in table @table. */
static bool check_refs(struct checker *c, struct seq *s, const uint8_t *p, size_t len,
                       const uint32_t *fields, const uint32_t *tables, size_t n)
{
    struct hp_pb_iter it;
    struct hp_pb_field f;
    hp_pb_iter_init(&it, p, len);
    while (hp_pb_next(&it, &f)) {
        for (size_t i = 0; i < n; i++) {
            if (f.num != fields[i])
                continue;
            struct hp_pb_ints ints;
            uint64_t v;
            bool err = false;
            hp_pb_ints_init(&ints, &f);
            while (hp_pb_ints_next(&ints, &v, &err)) {
                /* Id 0 of the string tables is "", defined by the first packet. */
                if (!is_defined(s, tables[i], v))
                    FAIL(c, "id %llu of table %u used before it is defined", (unsigned long long)v,
                         tables[i]);
            }
            if (err)
                FAIL(c, "malformed id list");
        }
    }
    if (it.error)
        FAIL(c, "malformed message");
    return true;
}

static bool check_interned(struct checker *c, struct seq *s, const uint8_t *p, size_t len)
{
    struct hp_pb_iter it;
    struct hp_pb_field f;
    /* Definitions first: a packet may refer to entries it defines itself. */
    hp_pb_iter_init(&it, p, len);
    while (hp_pb_next(&it, &f)) {
        if (f.wire_type != HP_PB_LEN || f.num >= N_TABLES)
            continue;
        uint64_t iid = varint_field(f.ptr, f.len, IID, UINT64_MAX);
        struct entry *v;
        int r = hp_map_put(&s->defined[f.num], iid, (void **)&v);
        if (r < 0)
            FAIL(c, "out of memory");
        if (r == 0)
            FAIL(c, "interned field %u: iid %llu defined twice", f.num, (unsigned long long)iid);
        *v = (struct entry){f.ptr, f.len};
    }
    if (it.error)
        FAIL(c, "malformed interned data");
    static const uint32_t map_f[] = {PF_MAPPING(build_id), PF_MAPPING(path_string_ids)},
                          map_t[] = {PF_INTERNED(build_ids), PF_INTERNED(mapping_paths)};
    static const uint32_t frame_f[] = {PF_FRAME(function_name_id), PF_FRAME(mapping_id)},
                          frame_t[] = {PF_INTERNED(function_names), PF_INTERNED(mappings)};
    static const uint32_t cs_f[] = {PF_CALLSTACK(frame_ids)}, cs_t[] = {PF_INTERNED(frames)};
    hp_pb_iter_init(&it, p, len);
    while (hp_pb_next(&it, &f)) {
        bool ok = true;
        if (f.num == PF_INTERNED(mappings))
            ok = check_refs(c, s, f.ptr, f.len, map_f, map_t, 2);
        else if (f.num == PF_INTERNED(frames))
            ok = check_refs(c, s, f.ptr, f.len, frame_f, frame_t, 2);
        else if (f.num == PF_INTERNED(callstacks))
            ok = check_refs(c, s, f.ptr, f.len, cs_f, cs_t, 1);
        if (!ok)
            return false;
    }
    return true;
}

static bool check_samples(struct checker *c, struct seq *s, const uint8_t *p, size_t len)
{
    uint64_t pid = varint_field(p, len, PF_DUMP(pid), 0);
    uint64_t heap = 0;
    struct hp_pb_iter it;
    struct hp_pb_field f;
    hp_pb_iter_init(&it, p, len);
    while (hp_pb_next(&it, &f))
        if (f.num == PF_DUMP(heap_name) && f.wire_type == HP_PB_LEN)
            heap = hp_hash_bytes(f.ptr, f.len, 3);
    hp_pb_iter_init(&it, p, len);
    while (hp_pb_next(&it, &f)) {
        if (f.num != PF_DUMP(samples) || f.wire_type != HP_PB_LEN)
            continue;
        static const uint32_t sf[] = {PF_SAMPLE(callstack_id)}, st[] = {PF_INTERNED(callstacks)};
        if (!check_refs(c, s, f.ptr, f.len, sf, st, 1))
            return false;
        uint64_t cs = varint_field(f.ptr, f.len, PF_SAMPLE(callstack_id), 0);
        void *used;
        if (hp_map_put(&s->dump_callstacks, cs, &used) < 0)
            FAIL(c, "out of memory");
        uint64_t v[4] = {varint_field(f.ptr, f.len, PF_SAMPLE(self_allocated), 0),
                         varint_field(f.ptr, f.len, PF_SAMPLE(self_freed), 0),
                         varint_field(f.ptr, f.len, PF_SAMPLE(alloc_count), 0),
                         varint_field(f.ptr, f.len, PF_SAMPLE(free_count), 0)};
        if (v[1] > v[0] || v[3] > v[2])
            FAIL(c, "pid %llu callstack %llu: more freed than allocated", (unsigned long long)pid,
                 (unsigned long long)cs);
        uint64_t key = hp_hash_combine(hp_hash_combine(hp_hash_u64(pid), heap), cs);
        key = hp_hash_combine(key, s->id);
        uint64_t *prev;
        if (hp_map_put(&c->cumulative, key, (void **)&prev) < 0)
            FAIL(c, "out of memory");
        for (int i = 0; i < 4; i++) {
            if (v[i] < prev[i])
                FAIL(c, "pid %llu callstack %llu: cumulative value %d went down (%llu < %llu)",
                     (unsigned long long)pid, (unsigned long long)cs, i, (unsigned long long)v[i],
                     (unsigned long long)prev[i]);
            prev[i] = v[i];
        }
    }
    return true;
}

/* The bytes of length-delimited field @num of @e (the last one), or an empty span. */
static struct entry bytes_field(const uint8_t *p, size_t len, uint32_t num)
{
    struct entry r = {NULL, 0};
    struct hp_pb_iter it;
    struct hp_pb_field f;
    hp_pb_iter_init(&it, p, len);
    while (hp_pb_next(&it, &f))
        if (f.num == num && f.wire_type == HP_PB_LEN)
            r = (struct entry){f.ptr, f.len};
    return r;
}

/* The string interned as @iid in @table (InternedString.str), or an empty span. */
static struct entry interned_str(struct seq *s, uint32_t table, uint64_t iid)
{
    const struct entry *e = hp_map_get(&s->defined[table], iid);
    return e ? bytes_field(e->p, e->len, PF_STRING(str)) : (struct entry){NULL, 0};
}

/* hash(path, build id, rel_pc), the key the trace processor finds a frame by for a
 * ModuleSymbols address: the mapping's path (its components joined by '/') and build
 * id bytes. */
static uint64_t frame_key(const uint8_t *path, size_t path_len, const uint8_t *bid, size_t bid_len,
                          uint64_t rel_pc)
{
    return hp_hash_combine(
        hp_hash_combine(hp_hash_bytes(path, path_len, 1), hp_hash_bytes(bid, bid_len, 2)),
        hp_hash_u64(rel_pc));
}

/* The end of a dump: the frames of its samples' callstacks now exist for the trace
 * processor. */
static bool note_dump_frames(struct checker *c, struct seq *s)
{
    size_t pos = 0;
    uint64_t cs;
    void *unused;
    while (hp_map_next(&s->dump_callstacks, &pos, &cs, &unused)) {
        const struct entry *ce = hp_map_get(&s->defined[PF_INTERNED(callstacks)], cs);
        if (!ce)
            continue; /* reported when the sample was checked */
        struct hp_pb_iter it;
        struct hp_pb_field f;
        hp_pb_iter_init(&it, ce->p, ce->len);
        while (hp_pb_next(&it, &f)) {
            if (f.num != PF_CALLSTACK(frame_ids))
                continue;
            struct hp_pb_ints ints;
            uint64_t fid;
            bool err = false;
            hp_pb_ints_init(&ints, &f);
            while (hp_pb_ints_next(&ints, &fid, &err)) {
                const struct entry *fe = hp_map_get(&s->defined[PF_INTERNED(frames)], fid);
                if (!fe)
                    FAIL(c, "callstack %llu: frame %llu is not defined when the dump ends",
                         (unsigned long long)cs, (unsigned long long)fid);
                uint64_t mid = varint_field(fe->p, fe->len, PF_FRAME(mapping_id), 0);
                uint64_t rel_pc = varint_field(fe->p, fe->len, PF_FRAME(rel_pc), 0);
                const struct entry *me = hp_map_get(&s->defined[PF_INTERNED(mappings)], mid);
                if (!me)
                    FAIL(c, "frame %llu: mapping %llu is not defined when the dump ends",
                         (unsigned long long)fid, (unsigned long long)mid);
                char path[4096];
                size_t pl = 0;
                struct hp_pb_iter mi;
                struct hp_pb_field mf;
                hp_pb_iter_init(&mi, me->p, me->len);
                while (hp_pb_next(&mi, &mf)) {
                    if (mf.num != PF_MAPPING(path_string_ids))
                        continue;
                    struct hp_pb_ints comps;
                    uint64_t sid;
                    bool cerr = false;
                    hp_pb_ints_init(&comps, &mf);
                    while (hp_pb_ints_next(&comps, &sid, &cerr)) {
                        struct entry str = interned_str(s, PF_INTERNED(mapping_paths), sid);
                        if (pl + 1 + str.len < sizeof(path)) {
                            path[pl++] = '/';
                            memcpy(path + pl, str.p, str.len);
                            pl += str.len;
                        }
                    }
                }
                struct entry bid =
                    interned_str(s, PF_INTERNED(build_ids),
                                 varint_field(me->p, me->len, PF_MAPPING(build_id), 0));
                if (hp_map_put(&c->used_frames,
                               frame_key((const uint8_t *)path, pl, bid.p, bid.len, rel_pc),
                               &unused) < 0)
                    FAIL(c, "out of memory");
            }
        }
    }
    hp_map_done(&s->dump_callstacks);
    hp_map_init(&s->dump_callstacks, 0);
    return true;
}

/* Every address with lines must name a frame a complete dump used before. */
static bool check_module_symbols(struct checker *c, const uint8_t *p, size_t len)
{
    struct entry path = bytes_field(p, len, PF_MODULE(path));
    struct entry bid = bytes_field(p, len, PF_MODULE(build_id));
    struct hp_pb_iter it;
    struct hp_pb_field f;
    hp_pb_iter_init(&it, p, len);
    while (hp_pb_next(&it, &f)) {
        if (f.num != PF_MODULE(address_symbols) || f.wire_type != HP_PB_LEN)
            continue;
        if (!bytes_field(f.ptr, f.len, PF_ADDRESS(lines)).p)
            continue; /* no lines: the trace processor skips it */
        uint64_t addr = varint_field(f.ptr, f.len, PF_ADDRESS(address), 0);
        if (!hp_map_get(&c->used_frames, frame_key(path.p, path.len, bid.p, bid.len, addr)))
            FAIL(c,
                 "ModuleSymbols of %.*s: address 0x%llx names no frame a complete dump used "
                 "before (the trace processor counts stackprofile_invalid_frame_id)",
                 (int)path.len, (const char *)path.p, (unsigned long long)addr);
    }
    return true;
}

/* True when @p carries what these rules are about: a profile, the data it refers to,
 * or the clock and processes it is read with. A trace written by Perfetto's traced also
 * holds the service's own packets (its config, stats, system info, sync markers), some
 * without a timestamp, which the trace processor reads by other rules. */
static bool profile_related(const uint8_t *p, size_t len)
{
    static const uint32_t fields[] = {PF_PACKET(profile_packet), PF_PACKET(interned_data),
                                      PF_PACKET(module_symbols), PF_PACKET(process_tree),
                                      PF_PACKET(clock_snapshot)};
    struct hp_pb_iter it;
    struct hp_pb_field f;
    hp_pb_iter_init(&it, p, len);
    while (hp_pb_next(&it, &f))
        for (size_t i = 0; i < HP_ARRAY_SIZE(fields); i++)
            if (f.num == fields[i])
                return true;
    return false;
}

static bool check_packet(struct checker *c, const uint8_t *p, size_t len)
{
    c->packets++;
    if (!profile_related(p, len))
        return true;
    uint64_t seq_id = varint_field(p, len, PF_PACKET(trusted_packet_sequence_id), 0);
    uint64_t flags = varint_field(p, len, PF_PACKET(sequence_flags), 0);
    bool timed = varint_field(p, len, PF_PACKET(timestamp), UINT64_MAX) != UINT64_MAX;
    /* traced's own ClockSnapshot: no timestamp (the snapshot holds the times), on the
     * service's sequence, which carries no interned data. */
    if (!timed && bytes_field(p, len, PF_PACKET(clock_snapshot)).p &&
        !bytes_field(p, len, PF_PACKET(profile_packet)).p &&
        !bytes_field(p, len, PF_PACKET(interned_data)).p) {
        c->clock = true;
        return true;
    }
    if (!seq_id)
        FAIL(c, "no trusted_packet_sequence_id");
    if (!timed)
        FAIL(c, "no timestamp");
    struct seq *s = NULL;
    for (size_t i = 0; i < c->n_seqs && !s; i++)
        if (c->seqs[i].id == seq_id)
            s = &c->seqs[i];
    if (!s) {
        if (c->n_seqs == HP_ARRAY_SIZE(c->seqs))
            FAIL(c, "too many sequences");
        s = &c->seqs[c->n_seqs++];
        s->id = (uint32_t)seq_id;
        for (size_t k = 0; k < HP_ARRAY_SIZE(s->defined); k++)
            hp_map_init(&s->defined[k], sizeof(struct entry));
        hp_map_init(&s->dump_callstacks, 0);
        if (!(flags & PF_SEQ_INCREMENTAL_STATE_CLEARED))
            FAIL(c, "the first packet of sequence %llu does not clear incremental state",
                 (unsigned long long)seq_id);
    } else if (flags & PF_SEQ_INCREMENTAL_STATE_CLEARED) {
        for (size_t k = 0; k < HP_ARRAY_SIZE(s->defined); k++) {
            hp_map_done(&s->defined[k]);
            hp_map_init(&s->defined[k], sizeof(struct entry));
        }
        /* A new generation of the sequence: the trace processor keeps the indices per
         * generation, and expects the first one to be 0 again. */
        s->next_index = 0;
    }
    struct hp_pb_iter it;
    struct hp_pb_field f;
    hp_pb_iter_init(&it, p, len);
    while (hp_pb_next(&it, &f)) {
        if (f.num == PF_PACKET(clock_snapshot) && f.wire_type == HP_PB_LEN)
            c->clock = true;
        if (f.num == PF_PACKET(interned_data) && f.wire_type == HP_PB_LEN &&
            !check_interned(c, s, f.ptr, f.len))
            return false;
        if (f.num == PF_PACKET(module_symbols) && f.wire_type == HP_PB_LEN &&
            !check_module_symbols(c, f.ptr, f.len))
            return false;
    }
    hp_pb_iter_init(&it, p, len);
    while (hp_pb_next(&it, &f)) {
        if (f.num != PF_PACKET(profile_packet) || f.wire_type != HP_PB_LEN)
            continue;
        c->profiles++;
        if (!c->clock)
            FAIL(c, "profile before any clock snapshot");
        if (!(flags & PF_SEQ_NEEDS_INCREMENTAL_STATE))
            FAIL(c, "profile packet without SEQ_NEEDS_INCREMENTAL_STATE");
        uint64_t index = varint_field(f.ptr, f.len, PF_PROFILE(index), UINT64_MAX);
        if (index != s->next_index)
            FAIL(c, "index %llu, expected %llu", (unsigned long long)index,
                 (unsigned long long)s->next_index);
        s->next_index++;
        bool continued = varint_field(f.ptr, f.len, PF_PROFILE(continued), 0) != 0;
        struct hp_pb_iter pi;
        struct hp_pb_field pf;
        hp_pb_iter_init(&pi, f.ptr, f.len);
        while (hp_pb_next(&pi, &pf))
            if (pf.num == PF_PROFILE(process_dumps) && pf.wire_type == HP_PB_LEN &&
                !check_samples(c, s, pf.ptr, pf.len))
                return false;
        s->in_dump = continued;
        c->dumps += !continued;
        if (!continued && !note_dump_frames(c, s))
            return false;
    }
    if (it.error)
        FAIL(c, "malformed packet");
    return true;
}

static bool check_file(const char *path)
{
    FILE *fp = fopen(path, "rbe");
    if (!fp) {
        perror(path);
        return false;
    }
    static struct checker c;
    memset(&c, 0, sizeof(c));
    c.path = path;
    hp_map_init(&c.cumulative, 4 * sizeof(uint64_t));
    hp_map_init(&c.used_frames, 0);
    size_t cap = 1 << 20, len = 0;
    uint8_t *buf = malloc(cap);
    size_t n;
    while (buf && (n = fread(buf + len, 1, cap - len, fp)) > 0) {
        len += n;
        if (len == cap) {
            uint8_t *b = realloc(buf, cap *= 2);
            if (!b)
                free(buf);
            buf = b;
        }
    }
    fclose(fp);
    bool ok = buf != NULL;
    struct hp_pb_iter it;
    struct hp_pb_field f;
    hp_pb_iter_init(&it, buf, len);
    while (ok && hp_pb_next(&it, &f)) {
        if (f.num != PF_TRACE(packet) || f.wire_type != HP_PB_LEN) {
            fprintf(stderr, "%s: not a Trace.packet field\n", path);
            ok = false;
        } else {
            ok = check_packet(&c, f.ptr, f.len);
        }
    }
    if (ok && it.error) {
        fprintf(stderr, "%s: truncated or malformed framing\n", path);
        ok = false;
    }
    for (size_t i = 0; ok && i < c.n_seqs; i++) {
        if (c.seqs[i].in_dump) {
            fprintf(stderr, "%s: the file ends inside a dump\n", path);
            ok = false;
        }
    }
    if (ok && !c.profiles) {
        fprintf(stderr, "%s: no profile packets\n", path);
        ok = false;
    }
    if (ok)
        printf("%s: %llu packets, %llu profile packets, %llu dumps: ok\n", path,
               (unsigned long long)c.packets, (unsigned long long)c.profiles,
               (unsigned long long)c.dumps);
    for (size_t i = 0; i < c.n_seqs; i++) {
        for (size_t k = 0; k < HP_ARRAY_SIZE(c.seqs[i].defined); k++)
            hp_map_done(&c.seqs[i].defined[k]);
        hp_map_done(&c.seqs[i].dump_callstacks);
    }
    hp_map_done(&c.cumulative);
    hp_map_done(&c.used_frames);
    free(buf);
    return ok;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s TRACE...\n", argv[0]);
        return 2;
    }
    int status = 0;
    for (int i = 1; i < argc; i++)
        if (!check_file(argv[i]))
            status = 1;
    return status;
}
