/* producer/data_source.c: the data source's instances on a connection (SetupDataSource,
 * StartDataSource, StopDataSource, Flush, ClearIncrementalState), the writer each one
 * gets, and what traced is told of their chunks: CommitData with the moves the writers
 * queued, and the acknowledgement of a flush once every writer it names has completed
 * its chunk, in the same CommitData as (or after) the moves of those chunks. Owner
 * thread only. */
#include "producer/producer_internal.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/containers.h"
#include "common/log.h"
#include "common/pbwire.h"
#include "protos/commit_data.pb.h"
#include "protos/producer_port.pb.h"

/* Moves per CommitData: ~12 bytes each keeps a frame far below 128 KiB. */
#define MOVES_PER_COMMIT 4096
#define MAX_WRITER_ID 32767

static struct prod__instance *find_instance(prod_t *p, uint64_t id)
{
    for (size_t i = 0; i < p->n_inst; i++)
        if (p->inst[i].id == id)
            return &p->inst[i];
    return NULL;
}

static void remove_instance(prod_t *p, struct prod__instance *in)
{
    if (in->w) {
        atomic_store_explicit(&in->w->detached, true, memory_order_release);
        prod_writer_unref(in->w);
    }
    *in = p->inst[--p->n_inst];
}

/* Sends the queued moves (several frames when many) and, with @flush_id, the flush ack
 * in the last one. */
void prod__send_commits(prod_t *p, uint64_t flush_id)
{
    struct prod__move *moves = NULL;
    size_t n = p->smb ? prod__smb_take_moves(p->smb, &moves) : 0;
    size_t i = 0;
    do {
        size_t k = HP_MIN(n - i, (size_t)MOVES_PER_COMMIT);
        bool last = i + k == n;
        if (k == 0 && !(last && flush_id))
            break;
        struct hp_pbw a = {0}, m = {0};
        for (size_t j = i; j < i + k; j++) {
            hp_pbw_uint_always(&m, perfetto_protos_CommitDataRequest_ChunksToMove_page_tag,
                               moves[j].page);
            hp_pbw_uint_always(&m, perfetto_protos_CommitDataRequest_ChunksToMove_chunk_tag,
                               moves[j].chunk);
            hp_pbw_uint_always(&m, perfetto_protos_CommitDataRequest_ChunksToMove_target_buffer_tag,
                               moves[j].target_buffer);
            hp_pbw_msg(&a, perfetto_protos_CommitDataRequest_chunks_to_move_tag, &m);
        }
        free(m.p);
        if (last && flush_id)
            hp_pbw_uint(&a, perfetto_protos_CommitDataRequest_flush_request_id_tag, flush_id);
        /* A reply tells the writers waiting for room that the moved chunks are free. */
        prod__invoke(p, PROD_M_COMMIT_DATA, &a, k == 0, PROD_REQ_COMMIT);
        p->stats.commits++;
        p->stats.chunks_moved += k;
        i += k;
    } while (i < n);
    free(moves);
}

static bool flush_done(prod_t *p, const struct prod__flush *f)
{
    for (size_t i = 0; i < f->n_ids; i++) {
        struct prod__instance *in = find_instance(p, f->ids[i]);
        if (in && in->w && !prod__writer_flushed(in->w, f->req))
            return false;
    }
    return true;
}

/* Acknowledges the flushes done, oldest first (an ack covers every earlier id). */
void prod__check_flushes(prod_t *p)
{
    size_t k = 0;
    while (k < p->n_flushes && flush_done(p, &p->flushes[k]))
        k++;
    if (k == 0)
        return;
    prod__send_commits(p, p->flushes[k - 1].req);
    p->stats.flushes_acked += k;
    memmove(p->flushes, p->flushes + k, (p->n_flushes - k) * sizeof(*p->flushes));
    p->n_flushes -= k;
}

static void notify_stopped(prod_t *p, uint64_t id)
{
    struct hp_pbw a = {0};
    hp_pbw_uint_always(&a, perfetto_protos_NotifyDataSourceStoppedRequest_data_source_id_tag, id);
    prod__invoke(p, PROD_M_NOTIFY_DATA_SOURCE_STOPPED, &a, true, PROD_REQ_NONE);
}

static void unregister_writer(prod_t *p, const prod_writer_t *w)
{
    struct hp_pbw a = {0};
    hp_pbw_uint_always(&a, perfetto_protos_UnregisterTraceWriterRequest_trace_writer_id_tag, w->id);
    prod__invoke(p, PROD_M_UNREGISTER_TRACE_WRITER, &a, true, PROD_REQ_NONE);
}

void prod_instance_stopped(prod_t *p, uint64_t instance_id)
{
    struct prod__instance *in = find_instance(p, instance_id);
    if (!in || p->state != PROD_CONN_READY)
        return;
    /* Socket order is enough: traced has moved the chunks before it reads the ack. */
    prod__send_commits(p, 0);
    notify_stopped(p, instance_id);
    if (in->w)
        unregister_writer(p, in->w);
    remove_instance(p, in);
    prod__check_flushes(p);
}

static uint16_t new_writer_id(prod_t *p)
{
    for (int tries = 0; tries < MAX_WRITER_ID; tries++) {
        uint16_t id = p->next_writer_id;
        p->next_writer_id = id >= MAX_WRITER_ID ? 1 : (uint16_t)(id + 1);
        bool used = false;
        for (size_t i = 0; i < p->n_inst && !used; i++)
            used = p->inst[i].w && p->inst[i].w->id == id;
        if (!used)
            return id;
    }
    return 0;
}

static void setup_ds(prod_t *p, const struct prod__command *c)
{
    const struct prod_ds_config *cfg = &c->config;
    if (find_instance(p, cfg->instance_id))
        return;
    if (hp_grow((void **)&p->inst, &p->cap_inst, p->n_inst + 1, sizeof(*p->inst)) < 0)
        return; /* unknown to us: its stop is acknowledged at once */
    struct prod__instance *in = &p->inst[p->n_inst++];
    *in = (struct prod__instance){.id = cfg->instance_id};
    p->stats.instances++;
    uint16_t wid = new_writer_id(p);
    if (!p->smb || !wid || cfg->target_buffer == 0 ||
        prod__writer_new(p->smb, wid, cfg->target_buffer, p->stall_budget_ms, &in->w) < 0) {
        hp_log_warn("producer: instance %llu: cannot set up a writer (%s)",
                    (unsigned long long)cfg->instance_id,
                    !p->smb ? "no shared memory buffer" : "no buffer or writer id");
        in->w = NULL;
        return;
    }
    struct hp_pbw a = {0};
    hp_pbw_uint_always(&a, perfetto_protos_RegisterTraceWriterRequest_trace_writer_id_tag, wid);
    hp_pbw_uint_always(&a, perfetto_protos_RegisterTraceWriterRequest_target_buffer_tag,
                       cfg->target_buffer);
    prod__invoke(p, PROD_M_REGISTER_TRACE_WRITER, &a, true, PROD_REQ_NONE);
    prod_writer_t *w = in->w;
    uint64_t id = cfg->instance_id;
    int r = p->cb.setup ? p->cb.setup(p->ctx, cfg, w) : -ENOTSUP;
    in = find_instance(p, id);
    if (r < 0 && in && in->w) {
        unregister_writer(p, in->w);
        atomic_store_explicit(&in->w->detached, true, memory_order_release);
        in->w = prod_writer_unref(in->w);
    }
}

void prod__ds_command(prod_t *p, const struct prod__command *c)
{
    struct prod__instance *in;
    switch (c->kind) {
    case PROD_CMD_SETUP_DS:
        setup_ds(p, c);
        break;
    case PROD_CMD_START_DS:
        in = find_instance(p, c->config.instance_id);
        if (in && in->w && !in->started) {
            in->started = true;
            if (p->cb.start)
                p->cb.start(p->ctx, in->id);
        }
        break;
    case PROD_CMD_STOP_DS:
        in = find_instance(p, c->config.instance_id);
        if (in && in->w && !in->stopping) {
            in->stopping = true;
            if (p->cb.stop)
                p->cb.stop(p->ctx, in->id);
        } else if (!in || !in->w) {
            /* Unknown or refused: nothing to finish. */
            notify_stopped(p, c->config.instance_id);
            if (in)
                remove_instance(p, in);
        }
        break;
    case PROD_CMD_FLUSH: {
        if (hp_grow((void **)&p->flushes, &p->cap_flushes, p->n_flushes + 1, sizeof(*p->flushes)) <
            0)
            break; /* unacknowledged: traced counts the flush as failed */
        struct prod__flush *f = &p->flushes[p->n_flushes++];
        f->req = c->request_id;
        f->n_ids = c->n_ids;
        memcpy(f->ids, c->ids, c->n_ids * sizeof(*c->ids));
        for (size_t i = 0; i < c->n_ids; i++) {
            in = find_instance(p, c->ids[i]);
            if (in && in->w)
                (void)prod__writer_flush(in->w, c->request_id);
        }
        prod__check_flushes(p);
        break;
    }
    case PROD_CMD_CLEAR_STATE:
        for (size_t i = 0; i < c->n_ids; i++) {
            in = find_instance(p, c->ids[i]);
            if (in && in->w)
                atomic_store_explicit(&in->w->clear_req, true, memory_order_release);
        }
        break;
    case PROD_CMD_SETUP_TRACING: /* the connection's (conn.c) */
    case PROD_CMD_UNKNOWN:
        break;
    }
}
