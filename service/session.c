/* service/session.c: the session as a whole: starting and stopping the threads, status,
 * dumps on demand, detaching every process. */
#include "service/svc_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/containers.h"
#include "common/fdpass.h"
#include "common/log.h"
#include "common/paths.h"
#include "service/svc.h"
#include "shmem_ring/utable.h"
#include "shmem_ring/wire.h"

void svc_get_status(svc_t *s, struct svc_status *ret)
{
    /* Ending before live, with acquire: a session removed since is then out of both
     * (its unwinder drops it from live, then from ending, with release), and
     * live_processes - ending_processes never counts it as running. */
    ret->ending_processes = atomic_load_explicit(&s->ending_clients, memory_order_acquire);
    ret->live_processes = atomic_load_explicit(&s->live_clients, memory_order_acquire);
    ret->processes = atomic_load_explicit(&s->processes, memory_order_relaxed);
    ret->samples = atomic_load_explicit(&s->samples, memory_order_relaxed);
    ret->records_dropped = atomic_load_explicit(&s->drops, memory_order_relaxed);
    ret->dumps = atomic_load_explicit(&s->stat_dumps, memory_order_relaxed);
    ret->output_bytes = atomic_load_explicit(&s->stat_bytes, memory_order_relaxed);
    ret->live_bytes = atomic_load_explicit(&s->stat_live_bytes, memory_order_relaxed);
}

int svc_dump_now(svc_t *s)
{
    if (s->n_unwinders == 0) {
        if (!svc__batch_add(&s->ctl, SVC_MSG_DUMP_ALL, 0, sizeof(struct svc_msg)))
            return -ENOMEM;
        svc__batch_post(&s->ctl);
        return 0;
    }
    /* Through the unwinders: records still in the rings (a polled ring is read a few
     * milliseconds late) make it into the dump. */
    for (unsigned i = 0; i < s->n_unwinders; i++) {
        struct svc_unwinder *u = &s->unwinders[i];
        pthread_mutex_lock(&u->lock);
        u->dump_requests++;
        pthread_mutex_unlock(&u->lock);
        svc__unwinder_wake(u);
    }
    return 0;
}

void svc_detach_all(svc_t *s, uint32_t flags)
{
    for (unsigned i = 0; i < s->n_unwinders; i++) {
        struct svc_unwinder *u = &s->unwinders[i];
        pthread_mutex_lock(&u->lock);
        u->detach = true;
        u->detach_flags |= flags;
        pthread_mutex_unlock(&u->lock);
        svc__unwinder_wake(u);
    }
}

unsigned svc_live_clients(svc_t *s)
{
    return atomic_load_explicit(&s->live_clients, memory_order_relaxed);
}

const char *svc_socket_path(svc_t *s)
{
    return s->sock_path;
}

/* The bookkeeping thread made room in a full queue: the unwinders read rings again. */
static void queue_room(void *ctx)
{
    struct svc *s = ctx;
    for (unsigned i = 0; i < s->n_unwinders; i++)
        svc__unwinder_wake(&s->unwinders[i]);
}

static int start_unwinder(struct svc *s, struct svc_unwinder *u)
{
    u->svc = s;
    pthread_mutex_init(&u->lock, NULL);
    u->batcher.q = &s->bkq;
    int r = pthread_create(&u->thread, NULL, svc__unwinder_main, u);
    return -r;
}

/* Source lines of a frame, inlined functions included, for the dump's ModuleSymbols
 * (bookkeeping thread). */
static int source_lines(void *ctx, const struct hp_mapping *m, uint64_t rel_pc, bool wait,
                        const struct hp_source_line **ret_lines, size_t *ret_n)
{
    (void)ctx;
    if (!wait)
        return unwinder_source_lines_nowait(m, rel_pc, ret_lines, ret_n);
    return unwinder_source_lines(m, rel_pc, ret_lines, ret_n);
}

static int create(const struct svc_config *cfg, int out_fd, const struct bk_sink *sink, svc_t **ret)
{
    char err[256];
    int r = svc_config_check(cfg, err, sizeof(err));
    if (r < 0) {
        hp_log_error("%s", err);
        return r;
    }
    struct svc *s = calloc(1, sizeof(*s));
    if (!s)
        return -ENOMEM;
    s->cfg = *cfg;
    s->out_fd = out_fd;
    s->listen_fd = s->epfd = -1;
    pthread_mutex_init(&s->done_lock, NULL);
    hp_map_init(&s->done, 0);
    hp_map_init(&s->seen, 0);
    hp_map_init(&s->ending, 0);
    hp_map_init(&s->routes, sizeof(uint64_t));
    svc__bkq_init(&s->bkq);
    s->bkq.on_room = queue_room;
    s->bkq.on_room_ctx = s;
    s->ctl.q = &s->bkq;

    r = svc__listener_open(s);
    if (r < 0)
        goto fail;

    r = unwinder_global_init();
    if (r < 0) {
        hp_log_error("cannot initialise the unwinder: %s", strerror(-r));
        goto fail;
    }
    unwinder_set_source_lines(!cfg->no_source_lines);
    r = bk_new(&(struct bk_config){.out_fd = out_fd,
                                   .sink = sink,
                                   .sequence_id = 1,
                                   .dump_at_max = cfg->dump_at_max,
                                   .no_malloc_heap = !svc_config_records_heap(cfg, "libc.malloc"),
                                   .source_lines = source_lines},
               &s->bk);
    if (r < 0)
        goto fail;
    s->dump_barriers = calloc(SVC_MAX_UNWINDERS, sizeof(*s->dump_barriers));
    if (!s->dump_barriers) {
        r = -ENOMEM;
        goto fail;
    }
    r = -pthread_create(&s->bk_thread, NULL, svc__bk_main, s);
    if (r < 0)
        goto fail;
    s->bk_started = true;

    unsigned n = cfg->unwinder_threads;
    if (n == 0) {
        long cpus = sysconf(_SC_NPROCESSORS_ONLN);
        n = cpus > 0 ? (unsigned)cpus : 1;
    }
    if (n > SVC_MAX_UNWINDERS)
        n = SVC_MAX_UNWINDERS;
    s->unwinders = calloc(n, sizeof(*s->unwinders));
    if (!s->unwinders) {
        r = -ENOMEM;
        goto fail;
    }
    /* Read by the bk thread, already running: set before any unwinder can answer. */
    s->n_dump_barriers = n;
    for (unsigned i = 0; i < n; i++) {
        s->unwinders[i].index = i;
        r = start_unwinder(s, &s->unwinders[i]);
        if (r < 0) {
            s->unwinders[i].svc = NULL;
            goto fail;
        }
        s->n_unwinders++;
    }
    *ret = s;
    return 0;
fail:
    svc_free(s);
    return r;
}

int svc_new(const struct svc_config *cfg, int out_fd, svc_t **ret)
{
    return create(cfg, out_fd, NULL, ret);
}

int svc_new_sink(const struct svc_config *cfg, const struct bk_sink *sink, svc_t **ret)
{
    return create(cfg, -1, sink, ret);
}

int svc_reject_concurrent(svc_t *s, pid_t pid)
{
    if (!svc__batch_add(&s->ctl, SVC_MSG_REJECTED, pid, sizeof(struct svc_msg_rejected)))
        return -ENOMEM;
    svc__batch_post(&s->ctl);
    return 0;
}

int svc_fd(svc_t *s)
{
    return s->epfd;
}

int svc_finish(svc_t *s, struct svc_summary *ret_summary)
{
    svc__listener_close(s);
    for (unsigned i = 0; i < s->n_unwinders; i++) {
        struct svc_unwinder *u = &s->unwinders[i];
        pthread_mutex_lock(&u->lock);
        u->stop = true;
        pthread_mutex_unlock(&u->lock);
        svc__unwinder_wake(u);
    }
    for (unsigned i = 0; i < s->n_unwinders; i++) {
        struct svc_unwinder *u = &s->unwinders[i];
        pthread_join(u->thread, NULL);
        /* clients handed over but never adopted */
        while (u->incoming) {
            struct svc_client *c = u->incoming;
            u->incoming = c->next;
            svc__client_free(c);
        }
        if (u->batcher.cur)
            free(u->batcher.cur);
        free(u->hangups);
        pthread_mutex_destroy(&u->lock);
    }
    if (s->bk_started) {
        svc__bkq_quit(&s->bkq);
        pthread_join(s->bk_thread, NULL);
        s->bk_started = false;
    }
    /* Only now: the bookkeeping thread reads the count until it is joined (queue_room()
     * wakes the unwinders when it made room; a wake of a stopped one is harmless). */
    s->n_unwinders = 0;
    if (ret_summary) {
        memset(ret_summary, 0, sizeof(*ret_summary));
        ret_summary->processes = atomic_load(&s->processes);
        ret_summary->samples = atomic_load(&s->samples);
        ret_summary->frees = atomic_load(&s->frees);
        ret_summary->records_dropped = atomic_load(&s->drops);
        ret_summary->unwinding_errors = atomic_load(&s->unwind_errors);
        ret_summary->handshakes_rejected = atomic_load(&s->rejected);
        ret_summary->corrupt_clients = atomic_load(&s->corrupt);
        ret_summary->walked_samples = atomic_load(&s->walked);
        ret_summary->audits = atomic_load(&s->audits);
        ret_summary->audit_mismatches = atomic_load(&s->audit_mismatches);
        ret_summary->truncated_stacks = atomic_load(&s->truncated_stacks);
        ret_summary->python_frames = atomic_load(&s->python_frames);
        ret_summary->python_unnamed = atomic_load(&s->python_unnamed);
        ret_summary->python_mismatches = atomic_load(&s->python_mismatches);
        ret_summary->python_codes_rejected = atomic_load(&s->python_codes_rejected);
        ret_summary->frees_lost = atomic_load(&s->frees_lost);
        ret_summary->unseen_call_slots = atomic_load(&s->unseen_call_slots);
        ret_summary->clients_timed_out = atomic_load(&s->timed_out);
        ret_summary->conn_closed = atomic_load(&s->conn_closed);
        ret_summary->forks_unfollowed = atomic_load(&s->forks_unfollowed);
        ret_summary->fork_hint = svc__fork_hint(&s->cfg);
        ret_summary->stall_waits = atomic_load(&s->stall_waits);
        ret_summary->stall_skips = atomic_load(&s->stall_skips);
        ret_summary->stall_cutoffs = atomic_load(&s->stall_cutoffs);
        ret_summary->reserve_failures = atomic_load(&s->reserve_failures);
        ret_summary->records_unread = atomic_load(&s->records_unread);
        ret_summary->records_lost_service = atomic_load(&s->records_lost_service);
        ret_summary->records_refused = s->bk_counters.dropped_records;
        ret_summary->records_no_process = s->bk_counters.records_no_process;
        ret_summary->queue_full_events = atomic_load(&s->bkq.full_events);
        ret_summary->output_bytes = s->bk_counters.bytes_written;
        ret_summary->write_error = s->bk_counters.last_write_error;
    }
    return s->bk_counters.last_write_error;
}

svc_t *svc_free(svc_t *s)
{
    if (!s)
        return NULL;
    if (s->n_unwinders || s->bk_started) {
        int ignored = svc_finish(s, NULL);
        (void)ignored;
    }
    free(s->unwinders);
    free(s->dump_barriers);
    s->bk = bk_free(s->bk);
    unwinder_global_done();
    if (s->listen_fd >= 0)
        (void)close(s->listen_fd);
    if (s->epfd >= 0)
        (void)close(s->epfd);
    if (s->sock_path && s->sock_path[0] != HP_ABSTRACT_PREFIX)
        (void)unlink(s->sock_path);
    if (s->dir && !s->cfg.socket_dir && !s->cfg.socket_path)
        (void)rmdir(s->dir);
    free(s->sock_path);
    free(s->dir);
    hp_map_done(&s->done);
    hp_map_done(&s->seen);
    hp_map_done(&s->ending);
    hp_map_done(&s->routes);
    free(s->ctl.cur);
    svc__bkq_done(&s->bkq);
    pthread_mutex_destroy(&s->done_lock);
    free(s);
    return NULL;
}
