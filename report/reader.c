/* report/reader.c: streaming reader of heap-profile traces: the file, its packets,
 * the packet sequences and the result (see report_internal.h for the other parts).
 *
 * The file is read one Trace.packet at a time into a buffer of at most
 * READ_MAX_PACKET_BYTES, and each packet is walked with the field iterator of
 * common/pbwire.h: no length from the file is trusted before it is checked
 * against the bytes actually present, so hostile input ends in -EBADMSG, never in a
 * crash or an allocation larger than the input.
 *
 * State kept while reading:
 * - per packet sequence (trusted_packet_sequence_id): the interning tables, reset by
 *   SEQ_INCREMENTAL_STATE_CLEARED, and the dump in progress (ProfilePackets linked by
 *   `continued`, checked by `index`);
 * - per (pid, program, heap): the number of complete dumps and the callsites of the
 *   selected one (or of all). A dump is resolved when it completes; each callstack is
 *   resolved once per sequence generation and its frames are shared, so following the
 *   latest dump of a long continuous trace costs one hash lookup per sample and dump;
 * - per pid: its current program. A ProcessTree entry with a new command line for a
 *   pid that was dumped before is the next program exec'd in it (heapprof writes one
 *   per process start, after the previous program's final dump), so each program is a
 *   process of its own, named by its own command line.
 *
 * What is kept for the result is counted against a budget proportional to the input
 * (rp__keep()); hash tables are seeded per load, so crafted ids cannot collide on
 * purpose.
 */
#include "report/report_internal.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>

#include "common/pbwire.h"
#include "common/strtab.h"

/* ---- helpers ---- */

const char *rp__intern(struct rd *rd, const char *s, size_t len)
{
    return hp_strtab_intern(rd->tp->strings, s, len);
}

int rp__keep(struct rd *rd, uint64_t n)
{
    rd->kept_bytes += n;
    return rd->kept_bytes > rd->budget_bytes ? -EFBIG : 0;
}

/* ---- sequences ---- */

static struct rd_seq *seq_get(struct rd *rd, uint32_t id)
{
    if (rd->last_seq && rd->last_seq->id == id)
        return rd->last_seq;
    uint64_t *idx;
    int r = hp_map_put(&rd->seq_index, id, (void **)&idx);
    if (r < 0)
        return NULL;
    if (r == 0)
        return rd->last_seq = rd->seqs[*idx];
    struct rd_seq *seq = NULL;
    if (rp__keep(rd, sizeof(*seq)) < 0 ||
        hp_grow((void **)&rd->seqs, &rd->cap_seqs, rd->n_seqs + 1, sizeof(*rd->seqs)) < 0 ||
        !(seq = calloc(1, sizeof(*seq)))) {
        hp_map_remove(&rd->seq_index, id);
        return NULL;
    }
    seq->id = id;
    rp__seq_tables_init(seq);
    hp_idtab_init(&seq->chain_index);
    *idx = rd->n_seqs;
    rd->seqs[rd->n_seqs++] = seq;
    return rd->last_seq = seq;
}

static int seq_clear(struct rd *rd, struct rd_seq *seq)
{
    (void)rd;
    if (seq->in_dump)
        rd->tp->pub.incomplete_dumps++;
    seq->in_dump = false;
    rp__chain_drop(seq);
    rp__seq_tables_done(seq);
    rp__seq_tables_init(seq);
    return 0;
}

/* ---- other packets ---- */

static int parse_process_tree(struct rd *rd, const uint8_t *buf, size_t len)
{
    struct hp_pb_iter it, pit;
    struct hp_pb_field f, pf;
    hp_pb_iter_init(&it, buf, len);
    while (hp_pb_next(&it, &f)) {
        if (f.num != PF_TREE(processes) || f.wire_type != HP_PB_LEN)
            continue;
        char line[READ_MAX_STRING_BYTES];
        size_t n = 0;
        int32_t pid = 0;
        hp_pb_iter_init(&pit, f.ptr, f.len);
        while (hp_pb_next(&pit, &pf)) {
            if (pf.num == PF_PROCESS(pid) && pf.wire_type == HP_PB_VARINT) {
                pid = (int32_t)pf.varint;
            } else if (pf.num == PF_PROCESS(cmdline) && pf.wire_type == HP_PB_LEN) {
                if (n && n < sizeof(line))
                    line[n++] = ' ';
                size_t c = HP_MIN(pf.len, sizeof(line) - n);
                memcpy(line + n, pf.ptr, c);
                n += c;
            }
        }
        if (pit.error)
            return -EBADMSG;
        const char *s = rp__intern(rd, line, n);
        struct rd_pid *pi;
        int put = s ? hp_map_put(&rd->pids, (uint64_t)(uint32_t)pid, (void **)&pi) : -ENOMEM;
        if (put < 0)
            return -ENOMEM;
        if (put == 0 && pi->dumped && pi->ended && pi->cmdline != s) {
            /* The pid runs another program now (exec): a new process. */
            pi->exec_index++;
            pi->dumped = pi->ended = false;
        }
        /* Else the first name, or a new title of the process while it runs (heapprof
         * writes one when the program retitles itself: setproctitle, a forked child):
         * the process is named by its latest. */
        pi->cmdline = s;
    }
    return it.error ? -EBADMSG : 0;
}

static int parse_packet(struct rd *rd, const uint8_t *buf, size_t len)
{
    struct hp_pb_iter it;
    struct hp_pb_field f;
    uint32_t seq_id = 0;
    bool cleared = false, profile = false;
    rd->tp->pub.n_packets++;
    hp_pb_iter_init(&it, buf, len);
    while (hp_pb_next(&it, &f)) {
        if (f.wire_type == HP_PB_VARINT) {
            if (f.num == PF_PACKET(trusted_packet_sequence_id))
                seq_id = (uint32_t)f.varint;
            else if (f.num == PF_PACKET(sequence_flags))
                cleared |= (f.varint & PF_SEQ_INCREMENTAL_STATE_CLEARED) != 0;
            else if (f.num == PF_PACKET(incremental_state_cleared))
                cleared |= f.varint != 0;
        } else if (f.wire_type == HP_PB_LEN) {
            if (f.num == PF_PACKET(profile_packet))
                profile = true;
            else if (f.num == PF_PACKET(clock_snapshot))
                rd->tp->pub.has_clock_snapshot = true;
        }
    }
    if (it.error)
        return -EBADMSG;
    struct rd_seq *seq = seq_get(rd, seq_id);
    if (!seq)
        return -ENOMEM;
    int r = cleared ? seq_clear(rd, seq) : 0;
    /* Interned data first: the packet's own payload may refer to it. */
    hp_pb_iter_init(&it, buf, len);
    while (r == 0 && hp_pb_next(&it, &f))
        if (f.num == PF_PACKET(interned_data) && f.wire_type == HP_PB_LEN)
            r = rp__parse_interned(rd, seq, f.ptr, f.len);
    hp_pb_iter_init(&it, buf, len);
    while (r == 0 && hp_pb_next(&it, &f)) {
        if (f.wire_type != HP_PB_LEN)
            continue;
        if (f.num == PF_PACKET(profile_packet))
            r = rp__parse_profile_packet(rd, seq, f.ptr, f.len);
        else if (f.num == PF_PACKET(process_tree))
            r = parse_process_tree(rd, f.ptr, f.len);
        else if (f.num == PF_PACKET(module_symbols))
            r = rp__parse_module_symbols(rd, f.ptr, f.len);
    }
    if (profile)
        rd->tp->pub.n_profile_packets++;
    return r;
}

/* ---- file ---- */

/* Reads a varint from @fp: 0, 1 at a clean end of file before the first byte, -EAGAIN
 * when the file ends inside it, -EBADMSG when it is too long. */
static int read_varint(FILE *fp, uint64_t *ret)
{
    uint64_t v = 0;
    for (unsigned shift = 0; shift < 70; shift += 7) {
        int c = getc(fp);
        if (c == EOF) {
            if (ferror(fp))
                return -EIO;
            return shift == 0 ? 1 : -EAGAIN;
        }
        if (shift == 63 && c > 1)
            return -EBADMSG;
        v |= (uint64_t)(c & 0x7f) << shift;
        if (!(c & 0x80)) {
            *ret = v;
            return 0;
        }
    }
    return -EBADMSG;
}

static int skip_bytes(FILE *fp, uint64_t n)
{
    while (n) {
        char tmp[4096];
        size_t c = (size_t)HP_MIN(n, (uint64_t)sizeof(tmp));
        if (fread(tmp, 1, c, fp) != c)
            return ferror(fp) ? -EIO : -EAGAIN;
        n -= c;
    }
    return 0;
}

/* Reads packets until the end; a truncated last packet ends the file (flagged). */
static int read_file(struct rd *rd, FILE *fp)
{
    uint8_t *buf = NULL;
    size_t cap = 0;
    int r;
    for (;;) {
        uint64_t tag, len;
        long at = ftell(fp);
        rd->tp->pub.truncated_at = at >= 0 ? (uint64_t)at : 0;
        r = read_varint(fp, &tag);
        if (r != 0)
            break;
        uint32_t wt = (uint32_t)(tag & 7);
        if ((tag >> 3) == 0) {
            r = -EBADMSG;
            break;
        }
        if (wt == HP_PB_VARINT) {
            r = read_varint(fp, &len);
        } else if (wt == HP_PB_FIXED64 || wt == HP_PB_FIXED32) {
            r = skip_bytes(fp, wt == HP_PB_FIXED64 ? 8 : 4);
        } else if (wt == HP_PB_LEN) {
            r = read_varint(fp, &len);
            if (r == 1)
                r = -EAGAIN;
            if (r != 0)
                break;
            if (len > READ_MAX_PACKET_BYTES) {
                r = -EBADMSG;
                break;
            }
            if ((tag >> 3) != PF_TRACE(packet)) {
                r = skip_bytes(fp, len); /* not a packet: Trace has no other fields */
                if (r != 0)
                    break;
                continue;
            }
            r = hp_grow((void **)&buf, &cap, (size_t)len + 1, 1);
            if (r < 0)
                break;
            if (fread(buf, 1, (size_t)len, fp) != (size_t)len) {
                r = ferror(fp) ? -EIO : -EAGAIN;
                break;
            }
            r = parse_packet(rd, buf, (size_t)len);
        } else {
            r = -EBADMSG;
        }
        if (r == 1)
            r = -EAGAIN;
        if (r != 0)
            break;
    }
    free(buf);
    if (r == -EAGAIN)
        rd->tp->pub.truncated = true;
    if (r == 1 || r == -EAGAIN)
        return 0; /* clean end, or a truncated last packet */
    return r;
}

/* ---- result ---- */

static void proc_arrays_free(struct rp_trace_callsite *callsites, struct rp_trace_dump *dumps,
                             size_t n_dumps)
{
    if (dumps) {
        for (size_t i = 0; i < n_dumps; i++)
            free(dumps[i].callsites);
        free(dumps);
    } else {
        free(callsites);
    }
}

/* Appends @pf's callsites to @into's possibly freed sites (left out when out of memory:
 * the totals still say how much). */
static void keep_possibly_freed_sites(struct rp_trace_process *into,
                                      const struct rp_trace_process *pf)
{
    if (!pf->n_callsites)
        return;
    size_t n = into->n_possibly_freed_sites + pf->n_callsites;
    struct rp_trace_callsite *v = realloc(into->possibly_freed_sites, n * sizeof(*v));
    if (!v)
        return;
    memcpy(v + into->n_possibly_freed_sites, pf->callsites, pf->n_callsites * sizeof(*v));
    into->possibly_freed_sites = v;
    into->n_possibly_freed_sites = n;
}

/* The heap PF_HEAP_POSSIBLY_FREED of a process holds allocations whose free may have
 * been lost: not unreleased memory, so not a process of its own with a ranking. Its live
 * totals and its sites go to the process's other heap (the first listed) and it leaves
 * the list. */
static void fold_possibly_freed(struct rp_trace *t)
{
    size_t kept = 0;
    for (size_t i = 0; i < t->n_processes; i++) {
        struct rp_trace_process *pf = &t->processes[i];
        struct rp_trace_process *into = NULL;
        if (strcmp(pf->heap_name, PF_HEAP_POSSIBLY_FREED) == 0)
            for (size_t j = 0; j < t->n_processes && !into; j++) {
                struct rp_trace_process *o = &t->processes[j];
                if (j != i && o->pid == pf->pid && o->exec_index == pf->exec_index &&
                    strcmp(o->heap_name, PF_HEAP_POSSIBLY_FREED) != 0)
                    into = o;
            }
        if (!into) {
            t->processes[kept++] = *pf;
            continue;
        }
        for (size_t k = 0; k < pf->n_callsites; k++) {
            const struct rp_trace_callsite *c = &pf->callsites[k];
            into->possibly_freed_bytes +=
                c->self_allocated > c->self_freed ? c->self_allocated - c->self_freed : 0;
            into->possibly_freed_count +=
                c->alloc_count > c->free_count ? c->alloc_count - c->free_count : 0;
        }
        keep_possibly_freed_sites(into, pf);
        proc_arrays_free(pf->callsites, (struct rp_trace_dump *)pf->dumps, pf->n_dumps);
        free((void *)pf->dump_totals);
    }
    t->n_processes = kept;
}

static int finish(struct rd *rd)
{
    struct rp_trace *t = &rd->tp->pub;
    for (size_t i = 0; i < rd->n_seqs; i++)
        if (rd->seqs[i]->in_dump)
            t->incomplete_dumps++; /* the file ends inside a dump */
    if (t->incomplete_dumps)
        t->truncated = true;
    else if (!t->truncated)
        t->truncated_at = t->file_bytes;
    int r = rp__attach_lines(rd);
    if (r < 0)
        return r;
    /* Programs named by a process tree but never dumped are listed too. */
    size_t pos = 0;
    uint64_t key;
    void *val;
    const char *empty = rp__intern(rd, "", 0);
    if (!empty)
        return -ENOMEM;
    while (hp_map_next(&rd->pids, &pos, &key, &val)) {
        const struct rd_pid *pi = val;
        int32_t pid = (int32_t)(uint32_t)key;
        if ((rd->opt->pid && pid != rd->opt->pid) || pi->dumped || !pi->cmdline)
            continue;
        struct rd_proc *p = rp__proc_get(rd, pid, pi->exec_index, empty);
        if (!p)
            return -ENOMEM;
        p->cmdline = pi->cmdline;
    }
    if (rd->n_procs) {
        t->processes = calloc(rd->n_procs, sizeof(*t->processes));
        if (!t->processes)
            return -ENOMEM;
    }
    for (size_t i = 0; i < rd->n_procs; i++) {
        struct rd_proc *p = &rd->procs[i];
        const struct rd_header *h = &p->hdr;
        t->processes[i] = (struct rp_trace_process){
            .pid = p->pid,
            .exec_index = p->exec_index,
            .cmdline = p->cmdline ? p->cmdline : empty,
            .heap_name = p->heap_name,
            .sampling_interval_bytes = h->sampling_interval_bytes,
            .timestamp = h->timestamp,
            .n_dumps = p->n_dumps,
            .selected = p->selected,
            .from_startup = h->from_startup,
            .disconnected = h->disconnected,
            .buffer_overran = h->buffer_overran,
            .buffer_corrupted = h->buffer_corrupted,
            .hit_guardrail = h->hit_guardrail,
            .client_error = h->client_error,
            .writer_stalled = h->writer_stalled,
            .connection_closed_by_program = h->connection_closed_by_program,
            .connection_lost = h->connection_lost,
            .unwinding_errors = h->unwinding_errors,
            .heap_samples = h->heap_samples,
            .map_reparses = h->map_reparses,
            .total_unwinding_time_us = h->total_unwinding_time_us,
            .client_spinlock_blocked_us = h->client_spinlock_blocked_us,
            .frees_lost = h->frees_lost,
            .writer_stalls = h->writer_stalls,
            .profile_start_ts = h->profile_start_ts,
            .process_start_ts = h->process_start_ts,
            .stalled_records_skipped = h->stalled_records_skipped,
            .losses = h->losses,
            .n_callsites = p->n_callsites,
            .callsites = p->callsites,
            .dumps = p->dumps,
            .dump_totals = p->totals,
        };
        /* The trace owns them now. */
        p->totals = NULL;
        p->callsites = NULL;
        p->dumps = NULL;
        p->cap_dumps = 0;
    }
    t->n_processes = rd->n_procs;
    fold_possibly_freed(t);
    return 0;
}

static void rd_done(struct rd *rd)
{
    for (size_t i = 0; i < rd->n_seqs; i++) {
        rp__chain_drop(rd->seqs[i]);
        free(rd->seqs[i]->chain);
        hp_idtab_done(&rd->seqs[i]->chain_index);
        rp__seq_tables_done(rd->seqs[i]);
        free(rd->seqs[i]);
    }
    free(rd->seqs);
    for (size_t i = 0; i < rd->n_procs; i++) {
        proc_arrays_free(rd->procs[i].callsites, rd->procs[i].dumps, rd->procs[i].n_dumps);
        free(rd->procs[i].totals);
    }
    free(rd->procs);
    hp_idtab_done(&rd->proc_index);
    hp_map_done(&rd->pids);
    hp_map_done(&rd->seq_index);
    free(rd->syms);
    hp_idtab_done(&rd->sym_index);
    free(rd->stacks);
    free(rd->tmp);
}

/* Reads the trace from @fp (NULL: an empty trace) of @size bytes. */
static int load_fp(FILE *fp, uint64_t size, const struct rp_trace_options *opt,
                   struct rp_trace **ret)
{
    static const struct rp_trace_options defaults = {0};
    struct trace_priv *tp = calloc(1, sizeof(*tp));
    if (!tp)
        return -ENOMEM;
    tp->strings = hp_strtab_new();
    tp->pub.file_bytes = size;
    struct rd rd = {.opt = opt ? opt : &defaults, .tp = tp};
    rd.budget_bytes = READ_BUDGET_BASE + READ_BUDGET_PER_BYTE * size;
    if (getrandom(&rd.hash_seed, sizeof(rd.hash_seed), GRND_NONBLOCK) != sizeof(rd.hash_seed))
        rd.hash_seed = (uint64_t)(uintptr_t)&rd ^ size; /* ASLR at least */
    hp_map_init(&rd.pids, sizeof(struct rd_pid));
    hp_map_init(&rd.seq_index, sizeof(uint64_t));
    hp_idtab_init(&rd.proc_index);
    hp_idtab_init(&rd.sym_index);
    int r = tp->strings ? (fp ? read_file(&rd, fp) : 0) : -ENOMEM;
    if (r == 0)
        r = finish(&rd);
    rd_done(&rd);
    if (r < 0) {
        rp_trace_free(&tp->pub);
        return r;
    }
    *ret = &tp->pub;
    return 0;
}

int rp_trace_load(const char *path, const struct rp_trace_options *opt, struct rp_trace **ret)
{
    FILE *fp = fopen(path, "rbe");
    if (!fp)
        return -errno;
    struct stat st;
    if (fstat(fileno(fp), &st) < 0 || S_ISDIR(st.st_mode)) {
        int e = S_ISDIR(st.st_mode) ? EISDIR : errno;
        fclose(fp);
        return -e;
    }
    int r = load_fp(fp, S_ISREG(st.st_mode) ? (uint64_t)st.st_size : 0, opt, ret);
    fclose(fp);
    return r;
}

int rp_trace_load_buffer(const void *buf, size_t len, const struct rp_trace_options *opt,
                         struct rp_trace **ret)
{
    if (len == 0)
        return load_fp(NULL, 0, opt, ret);
    FILE *fp = fmemopen((void *)buf, len, "rb");
    if (!fp)
        return -errno;
    int r = load_fp(fp, len, opt, ret);
    fclose(fp);
    return r;
}

struct rp_trace *rp_trace_free(struct rp_trace *t)
{
    if (!t)
        return NULL;
    struct trace_priv *tp = (struct trace_priv *)t;
    for (size_t i = 0; i < t->n_processes; i++) {
        struct rp_trace_process *p = &t->processes[i];
        proc_arrays_free(p->callsites, (struct rp_trace_dump *)p->dumps, p->n_dumps);
        free((void *)p->dump_totals);
        free(p->possibly_freed_sites);
    }
    free(t->processes);
    hp_strtab_free(tp->strings);
    hp_arena_done(&tp->arena);
    free(tp);
    return NULL;
}
