/* report/pprof.c: one process's dump as a gzipped pprof Profile (perftools.profiles,
 * protos/profile.proto), for `heapprof pprof`.
 *
 * Encoded by hand with an append-only writer: each section goes to its own buffer while
 * strings, mappings, functions and locations are deduplicated, then the sections are
 * concatenated and gzipped with zlib. Every sample has four values: alloc_objects
 * (count), alloc_space (bytes), inuse_objects (count), inuse_space (bytes), where "in
 * use" is what was allocated and not freed at the dump; counts are estimates scaled by
 * rp_callsite_count_scale(), as Go's runtime scales its heap profiles.
 *
 * As pprof's tools expect: the main executable is the first mapping (`File:`), a frame
 * with source lines has one Line per function inlined at its pc (innermost first, the
 * frame's own function last) with Function.filename set, and a frame without a name is
 * named "<module>+0x<rel_pc>", so unnamed frames stay apart instead of collapsing into
 * one node per module.
 */
#include "report/report.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>
#include <zlib.h>

#include "common/containers.h"
#include "common/pbwire.h"
#include "common/strtab.h"
#include "protos/profile.pb.h"

/* Field numbers, from the code nanopb generates from protos/profile.proto. */
#define PP_PROFILE(f) perftools_profiles_Profile_##f##_tag
#define PP_VALUE_TYPE(f) perftools_profiles_ValueType_##f##_tag
#define PP_SAMPLE(f) perftools_profiles_Sample_##f##_tag
#define PP_MAPPING(f) perftools_profiles_Mapping_##f##_tag
#define PP_LOCATION(f) perftools_profiles_Location_##f##_tag
#define PP_LINE(f) perftools_profiles_Line_##f##_tag
#define PP_FUNCTION(f) perftools_profiles_Function_##f##_tag

struct pp_mapping {
    const char *path, *build_id;
    uint64_t start, end, offset;
};

struct pp_location {
    uint64_t mapping_id, address;
    const struct rp_trace_frame *frame; /* its lines, for the encoding */
};

struct pp_function {
    const char *name, *file;
};

struct pp {
    struct hp_pbw strings, samples, mappings, locations, functions, tmp, tmp2, line;
    struct hp_map str_index; /* const char * -> string index */
    size_t n_strings;
    struct hp_map map_index, loc_index, fn_index; /* content hash -> id */
    struct pp_mapping *maps;
    size_t n_maps, cap_maps;
    struct pp_location *locs;
    size_t n_locs, cap_locs;
    struct pp_function *fns;
    size_t n_fns, cap_fns;
    hp_strtab_t *names; /* names made up for unnamed frames */
    uint64_t seed;      /* of the content hashes: hostile traces cannot aim at collisions */
};

/* The string table index of @s, keyed by pointer (the trace's strings are interned, so
 * equal strings from the trace share one entry). */
static uint64_t str_id(struct pp *pp, const char *s)
{
    if (!s || !*s)
        return 0;
    uint64_t *v;
    int r = hp_map_put(&pp->str_index, (uint64_t)(uintptr_t)s, (void **)&v);
    if (r < 0) {
        pp->strings.oom = true;
        return 0;
    }
    if (r == 1) {
        *v = pp->n_strings++;
        hp_pbw_len(&pp->strings, PP_PROFILE(string_table), s, strlen(s));
    }
    return *v;
}

/* A new string @s (copied now), not interned: for strings made on the fly. */
static uint64_t str_new(struct pp *pp, const char *s)
{
    if (!s || !*s)
        return 0;
    hp_pbw_len(&pp->strings, PP_PROFILE(string_table), s, strlen(s));
    return pp->n_strings++;
}

/* Finds @key (by @hash and @eq) or adds it with @add; returns its 1-based id. */
static uint64_t dedup(struct hp_map *index, uint64_t hash,
                      bool (*eq)(struct pp *, uint64_t, const void *),
                      uint64_t (*add)(struct pp *, const void *), struct pp *pp, const void *key)
{
    for (uint64_t h = hash;; h++) {
        uint64_t *v;
        int r = hp_map_put(index, h, (void **)&v);
        if (r < 0)
            return 0;
        if (r == 1) {
            *v = add(pp, key);
            return *v;
        }
        if (eq(pp, *v, key))
            return *v;
    }
}

static bool map_eq(struct pp *pp, uint64_t id, const void *key)
{
    const struct pp_mapping *a = &pp->maps[id - 1], *b = key;
    return a->path == b->path && a->build_id == b->build_id && a->start == b->start &&
           a->end == b->end && a->offset == b->offset;
}

static uint64_t map_add(struct pp *pp, const void *key)
{
    const struct pp_mapping *m = key;
    if (hp_grow((void **)&pp->maps, &pp->cap_maps, pp->n_maps + 1, sizeof(*m)) < 0) {
        pp->mappings.oom = true;
        return 0;
    }
    pp->maps[pp->n_maps++] = *m;
    uint64_t id = pp->n_maps;
    struct hp_pbw *t = &pp->tmp;
    hp_pbw_uint(t, PP_MAPPING(id), id);
    hp_pbw_uint(t, PP_MAPPING(memory_start), m->start);
    hp_pbw_uint(t, PP_MAPPING(memory_limit), m->end);
    hp_pbw_uint(t, PP_MAPPING(file_offset), m->offset);
    hp_pbw_uint(t, PP_MAPPING(filename), str_id(pp, m->path));
    hp_pbw_uint(t, PP_MAPPING(build_id), str_id(pp, m->build_id));
    hp_pbw_uint(t, PP_MAPPING(has_functions), 1); /* names come from the trace */
    hp_pbw_msg(&pp->mappings, PP_PROFILE(mapping), t);
    return id;
}

static bool fn_eq(struct pp *pp, uint64_t id, const void *key)
{
    const struct pp_function *a = &pp->fns[id - 1], *b = key;
    return a->name == b->name && a->file == b->file;
}

static uint64_t fn_add(struct pp *pp, const void *key)
{
    if (hp_grow((void **)&pp->fns, &pp->cap_fns, pp->n_fns + 1, sizeof(*pp->fns)) < 0) {
        pp->functions.oom = true;
        return 0;
    }
    const struct pp_function *fn = key;
    pp->fns[pp->n_fns++] = *fn;
    uint64_t id = pp->n_fns;
    struct hp_pbw *t = &pp->tmp;
    /* name demangled (C++, Rust), system_name as the binary has it; each function is
     * added once, so its demangled name gets a string of its own. */
    uint64_t system_name = str_id(pp, fn->name);
    char buf[1024];
    const char *d = rp_demangle(fn->name, buf, sizeof(buf));
    uint64_t name = d == fn->name ? system_name : str_new(pp, d);
    hp_pbw_uint(t, PP_FUNCTION(id), id);
    hp_pbw_uint(t, PP_FUNCTION(name), name);
    hp_pbw_uint(t, PP_FUNCTION(system_name), system_name);
    hp_pbw_uint(t, PP_FUNCTION(filename), str_id(pp, fn->file));
    hp_pbw_msg(&pp->functions, PP_PROFILE(function), t);
    return id;
}

/* The function (@name, @file); strings from the trace or pp->names (interned). */
static uint64_t function_of(struct pp *pp, const char *name, const char *file)
{
    struct pp_function fn = {name, file && *file ? file : NULL};
    uint64_t h = hp_hash_combine(hp_hash_combine(pp->seed, (uintptr_t)fn.name), (uintptr_t)fn.file);
    return dedup(&pp->fn_index, h, fn_eq, fn_add, pp, &fn);
}

/* The name of a frame: its own, else "<module>+0x<rel_pc>". */
static const char *frame_fn_name(struct pp *pp, const struct rp_trace_frame *f)
{
    if (f->function_name && *f->function_name)
        return f->function_name;
    const char *path = f->mapping_path && *f->mapping_path ? f->mapping_path : "?";
    const char *base = strrchr(path, '/');
    char buf[512];
    int n = snprintf(buf, sizeof(buf), "%s+%#" PRIx64, base ? base + 1 : path, f->rel_pc);
    if (n < 0)
        return NULL;
    return hp_strtab_intern(pp->names, buf, HP_MIN((size_t)n, sizeof(buf) - 1));
}

static void put_line(struct pp *pp, struct hp_pbw *loc, uint64_t fn_id, uint32_t line)
{
    hp_pbw_uint(&pp->line, PP_LINE(function_id), fn_id);
    hp_pbw_uint(&pp->line, PP_LINE(line), line);
    hp_pbw_msg(loc, PP_LOCATION(line), &pp->line);
}

static bool loc_eq(struct pp *pp, uint64_t id, const void *key)
{
    const struct pp_location *a = &pp->locs[id - 1], *b = key;
    return a->mapping_id == b->mapping_id && a->address == b->address &&
           a->frame->function_name == b->frame->function_name;
}

static uint64_t loc_add(struct pp *pp, const void *key)
{
    const struct pp_location *l = key;
    const struct rp_trace_frame *f = l->frame;
    /* The functions first: their encoding uses pp->tmp too. */
    uint64_t fn_ids[65];
    size_t n_fn = 0;
    for (uint32_t k = 0; k < f->n_inlined && n_fn + 1 < HP_ARRAY_SIZE(fn_ids); k++)
        fn_ids[n_fn++] = function_of(
            pp, f->inlined[k].function_name[0] ? f->inlined[k].function_name : "<inlined>",
            f->inlined[k].file);
    fn_ids[n_fn++] = function_of(pp, frame_fn_name(pp, f), f->file);
    if (hp_grow((void **)&pp->locs, &pp->cap_locs, pp->n_locs + 1, sizeof(*l)) < 0) {
        pp->locations.oom = true;
        return 0;
    }
    pp->locs[pp->n_locs++] = *l;
    uint64_t id = pp->n_locs;
    struct hp_pbw *t = &pp->tmp;
    hp_pbw_uint(t, PP_LOCATION(id), id);
    hp_pbw_uint(t, PP_LOCATION(mapping_id), l->mapping_id);
    hp_pbw_uint(t, PP_LOCATION(address), l->address);
    /* pprof: the last Line is the caller the ones before it were inlined into. */
    for (size_t k = 0; k + 1 < n_fn; k++)
        put_line(pp, t, fn_ids[k], f->inlined[k].line);
    put_line(pp, t, fn_ids[n_fn - 1], f->line);
    hp_pbw_msg(&pp->locations, PP_PROFILE(location), t);
    return id;
}

static uint64_t mapping_of(struct pp *pp, const struct rp_trace_frame *f)
{
    struct pp_mapping m = {.path = f->mapping_path,
                           .build_id = f->build_id,
                           .start = f->map_start,
                           .end = f->map_end,
                           .offset = f->map_offset};
    uint64_t h =
        hp_hash_combine(hp_hash_combine(pp->seed, (uintptr_t)m.path), (uintptr_t)m.build_id);
    h = hp_hash_combine(hp_hash_combine(h, m.start), m.offset);
    return dedup(&pp->map_index, h, map_eq, map_add, pp, &m);
}

static uint64_t location_of(struct pp *pp, const struct rp_trace_frame *f)
{
    uint64_t map_id = mapping_of(pp, f);
    /* rel_pc is an ELF virtual address; pprof wants the address in the process. */
    uint64_t address = f->rel_pc;
    uint64_t base = f->map_load_bias + f->map_offset;
    if (f->map_end > f->map_start && f->rel_pc >= base &&
        f->rel_pc - base < f->map_end - f->map_start)
        address = f->map_start + (f->rel_pc - base);
    struct pp_location l = {.mapping_id = map_id, .address = address, .frame = f};
    uint64_t h = hp_hash_combine(hp_hash_combine(hp_hash_combine(pp->seed, map_id), address),
                                 (uintptr_t)f->function_name);
    return dedup(&pp->loc_index, h, loc_eq, loc_add, pp, &l);
}

static bool is_shared_object(const char *path)
{
    const char *base = strrchr(path, '/');
    return strstr(base ? base : path, ".so") != NULL;
}

/* The frame of the main executable, so that its mapping goes first (pprof names the
 * profile's program after mapping 1): the mapping named like the command (argv[0]);
 * else the one the most stacks start in that is not a shared object (_start's); else
 * any mapping that is not a shared object. NULL when none is found. */
static const struct rp_trace_frame *main_frame(const struct rp_trace_process *p,
                                               const struct rp_trace_callsite *cs, size_t n)
{
    char argv0[256];
    const char *cmd = p->cmdline ? p->cmdline : "";
    size_t k = strcspn(cmd, " ");
    snprintf(argv0, sizeof(argv0), "%.*s", (int)HP_MIN(k, sizeof(argv0) - 1), cmd);
    const char *want = strrchr(argv0, '/') ? strrchr(argv0, '/') + 1 : argv0;
    const struct rp_trace_frame *root = NULL, *other = NULL;
    for (size_t i = 0; i < n; i++) {
        for (size_t j = 0; j < cs[i].n_frames; j++) {
            const struct rp_trace_frame *f = &cs[i].frames[j];
            const char *path = f->mapping_path ? f->mapping_path : "";
            const char *base = strrchr(path, '/') ? strrchr(path, '/') + 1 : path;
            if (!*path || path[0] == '[')
                continue;
            if (*want && !strcmp(base, want))
                return f;
            if (!is_shared_object(path)) {
                if (j == 0 && !root)
                    root = f;
                if (!other)
                    other = f;
            }
        }
    }
    return root ? root : other;
}

static void value_type(struct pp *pp, struct hp_pbw *out, uint32_t field, const char *type,
                       const char *unit)
{
    hp_pbw_uint(&pp->tmp, PP_VALUE_TYPE(type), str_id(pp, type));
    hp_pbw_uint(&pp->tmp, PP_VALUE_TYPE(unit), str_id(pp, unit));
    hp_pbw_msg(out, field, &pp->tmp);
}

static void pp_done(struct pp *pp)
{
    struct hp_pbw *w[] = {&pp->strings,   &pp->samples, &pp->mappings, &pp->locations,
                          &pp->functions, &pp->tmp,     &pp->tmp2,     &pp->line};
    for (size_t i = 0; i < HP_ARRAY_SIZE(w); i++)
        free(w[i]->p);
    hp_map_done(&pp->str_index);
    hp_map_done(&pp->map_index);
    hp_map_done(&pp->loc_index);
    hp_map_done(&pp->fn_index);
    free(pp->maps);
    free(pp->locs);
    free(pp->fns);
    hp_strtab_free(pp->names);
}

static int gzip_to_fd(int fd, const struct hp_pbw *parts[], size_t n_parts)
{
    z_stream z = {0};
    /* 16 + 15: a gzip wrapper around a 32 KiB-window deflate stream. */
    if (deflateInit2(&z, Z_DEFAULT_COMPRESSION, Z_DEFLATED, 16 + 15, 8, Z_DEFAULT_STRATEGY) != Z_OK)
        return -ENOMEM;
    uint8_t out[1 << 16];
    int r = 0;
    for (size_t i = 0; i < n_parts && r == 0; i++) {
        z.next_in = parts[i]->p;
        z.avail_in = (uInt)parts[i]->len; /* parts stay far below 4 GiB */
        int flush = i + 1 == n_parts ? Z_FINISH : Z_NO_FLUSH;
        int zr;
        do {
            z.next_out = out;
            z.avail_out = sizeof(out);
            zr = deflate(&z, flush);
            if (zr == Z_STREAM_ERROR) {
                r = -EIO;
                break;
            }
            size_t have = sizeof(out) - z.avail_out;
            for (size_t off = 0; off < have && r == 0;) {
                ssize_t wr = write(fd, out + off, have - off);
                if (wr < 0 && errno != EINTR)
                    r = -errno;
                else if (wr > 0)
                    off += (size_t)wr;
            }
        } while (r == 0 && (z.avail_out == 0 || (flush == Z_FINISH && zr != Z_STREAM_END)));
    }
    deflateEnd(&z);
    return r;
}

int rp_pprof_write(const struct rp_trace *t, const struct rp_trace_process *p, int fd)
{
    (void)t;
    struct rp_trace_dump d = {.timestamp = p->timestamp,
                              .sampling_interval_bytes = p->sampling_interval_bytes,
                              .n_callsites = p->n_callsites,
                              .callsites = p->callsites};
    return rp_pprof_write_dump(p, &d, fd);
}

int rp_pprof_write_dump(const struct rp_trace_process *p, const struct rp_trace_dump *d, int fd)
{
    return rp_pprof_write_dump_as(p, d, "inuse_space", fd);
}

/* The sample types, each value of a sample in this order. */
static const char *const sample_types[][2] = {
    {"alloc_objects", "count"},
    {"alloc_space", "bytes"},
    {"inuse_objects", "count"},
    {"inuse_space", "bytes"},
};

int rp_pprof_write_dump_as(const struct rp_trace_process *p, const struct rp_trace_dump *d,
                           const char *default_sample_type, int fd)
{
    /* Strings are keyed by pointer (str_id()): the default is named by the table's. */
    const char *dflt = NULL;
    for (size_t i = 0; i < HP_ARRAY_SIZE(sample_types); i++)
        if (strcmp(default_sample_type, sample_types[i][0]) == 0)
            dflt = sample_types[i][0];
    if (!dflt)
        return -EINVAL;
    struct pp pp = {.n_strings = 1, .names = hp_strtab_new()};
    if (!pp.names)
        return -ENOMEM;
    if (getrandom(&pp.seed, sizeof(pp.seed), GRND_NONBLOCK) != sizeof(pp.seed))
        pp.seed = hp_hash_u64((uintptr_t)&pp);
    hp_map_init(&pp.str_index, sizeof(uint64_t));
    hp_map_init(&pp.map_index, sizeof(uint64_t));
    hp_map_init(&pp.loc_index, sizeof(uint64_t));
    hp_map_init(&pp.fn_index, sizeof(uint64_t));
    hp_pbw_len(&pp.strings, PP_PROFILE(string_table), "", 0); /* string_table[0] must be "" */

    struct hp_pbw head = {0};
    for (size_t i = 0; i < HP_ARRAY_SIZE(sample_types); i++)
        value_type(&pp, &head, PP_PROFILE(sample_type), sample_types[i][0], sample_types[i][1]);
    value_type(&pp, &head, PP_PROFILE(period_type), "space", "bytes");
    hp_pbw_uint(&head, PP_PROFILE(period), d->sampling_interval_bytes);
    /* A string table index, not a position in sample_type. */
    hp_pbw_uint(&head, PP_PROFILE(default_sample_type), str_id(&pp, dflt));

    const struct rp_trace_frame *exe = main_frame(p, d->callsites, d->n_callsites);
    if (exe)
        (void)mapping_of(&pp, exe);
    for (size_t i = 0; i < d->n_callsites; i++) {
        const struct rp_trace_callsite *c = &d->callsites[i];
        struct hp_pbw *s = &pp.tmp2;
        struct hp_pbw ids = {0};
        for (size_t j = c->n_frames; j-- > 0;) /* leaf first */
            hp_pbw_varint(&ids, location_of(&pp, &c->frames[j]));
        hp_pbw_len(s, PP_SAMPLE(location_id), ids.p, ids.len); /* packed */
        s->oom |= ids.oom;
        free(ids.p);
        struct hp_pbw vals = {0};
        double scale = rp_callsite_count_scale(c);
        uint64_t live = c->alloc_count - HP_MIN(c->free_count, c->alloc_count);
        hp_pbw_varint(&vals, (uint64_t)((double)c->alloc_count * scale + 0.5));
        hp_pbw_varint(&vals, c->self_allocated);
        hp_pbw_varint(&vals, (uint64_t)((double)live * scale + 0.5));
        hp_pbw_varint(&vals, c->self_allocated - HP_MIN(c->self_freed, c->self_allocated));
        hp_pbw_len(s, PP_SAMPLE(value), vals.p, vals.len);
        s->oom |= vals.oom;
        free(vals.p);
        hp_pbw_msg(&pp.samples, PP_PROFILE(sample), s);
    }
    const struct hp_pbw *parts[] = {&head,         &pp.samples,   &pp.mappings,
                                    &pp.locations, &pp.functions, &pp.strings};
    int r = 0;
    for (size_t i = 0; i < HP_ARRAY_SIZE(parts); i++)
        if (parts[i]->oom)
            r = -ENOMEM;
    if (r == 0)
        r = gzip_to_fd(fd, parts, HP_ARRAY_SIZE(parts));
    free(head.p);
    pp_done(&pp);
    return r;
}

/* "PREFIX.pid<PID>[.exec<K>].<heap>.dump<N>.pb.gz"; the heap name comes from the trace
 * (any bytes): only letters, digits, '.', '-' and '_' of it, the rest as '_', and never
 * a name of its own (".", ".."). */
static int export_one(const struct rp_trace_process *p, const struct rp_trace_dump *d,
                      const char *out, bool exact, int dump, FILE *log)
{
    char heap[64], exec[32] = "", path[4096];
    size_t n = 0;
    for (const char *h = p->heap_name; *h && n + 1 < sizeof(heap); h++) {
        char ch = *h;
        bool ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
                  (ch >= '0' && ch <= '9') || ch == '.' || ch == '-' || ch == '_';
        heap[n++] = ok ? ch : '_';
    }
    heap[n] = '\0';
    if (n == 0 || !strcmp(heap, ".") || !strcmp(heap, ".."))
        snprintf(heap, sizeof(heap), "heap");
    if (p->exec_index)
        snprintf(exec, sizeof(exec), ".exec%" PRIu32, p->exec_index);
    int len = exact ? snprintf(path, sizeof(path), "%s", out)
                    : snprintf(path, sizeof(path), "%s.pid%d%s.%s.dump%d.pb.gz", out, (int)p->pid,
                               exec, heap, dump);
    if (len < 0 || (size_t)len >= sizeof(path))
        return -ENAMETOOLONG;
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644);
    if (fd < 0)
        return -errno;
    int r = rp_pprof_write_dump(p, d, fd);
    if (close(fd) < 0 && r == 0)
        r = -errno;
    if (r == 0 && log)
        fprintf(log, "%s\n", path);
    return r;
}

int rp_pprof_export(const char *trace_path, const char *out, int dump_index, int32_t pid, FILE *log,
                    bool *ret_truncated)
{
    return rp_pprof_export_filtered(trace_path, out, dump_index, pid, NULL, log, ret_truncated);
}

int rp_pprof_export_filtered(const char *trace_path, const char *out, int dump_index, int32_t pid,
                             rp_filter_t *f, FILE *log, bool *ret_truncated)
{
    /* One pass keeps every dump: memory stays proportional to the trace (the reader's
     * budget), and the source lines that follow each dump are attached to all. */
    struct rp_trace *t;
    int r =
        rp_trace_load(trace_path, &(struct rp_trace_options){.pid = pid, .all_dumps = true}, &t);
    if (r == 0 && f && (r = rp_trace_filter(t, f)) < 0)
        t = rp_trace_free(t);
    if (r < 0)
        return r;
    if (ret_truncated)
        *ret_truncated = t->truncated;
    size_t n_profiles = 0;
    for (size_t i = 0; i < t->n_processes; i++) {
        uint32_t nd = t->processes[i].n_dumps;
        n_profiles += dump_index > 0 ? (nd >= (uint32_t)dump_index) : nd;
    }
    size_t olen = strlen(out);
    bool exact = n_profiles == 1 && olen > 6 && !strcmp(out + olen - 6, ".pb.gz");
    for (size_t i = 0; r == 0 && i < t->n_processes; i++) {
        const struct rp_trace_process *p = &t->processes[i];
        for (uint32_t k = 0; r == 0 && p->dumps && k < p->n_dumps; k++) {
            if (dump_index > 0 && k + 1 != (uint32_t)dump_index)
                continue;
            r = export_one(p, &p->dumps[k], out, exact, (int)k + 1, log);
        }
    }
    rp_trace_free(t);
    if (r == 0 && n_profiles == 0)
        return -ENODATA;
    return r;
}
