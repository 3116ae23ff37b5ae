/* cli/cmd_producer.c: `heapprofd --producer`: the daemon as a data source of Perfetto's
 * tracing service. The producer connection (producer/) turns traced's commands into
 * sessions of the service (service/multi.c), one per data source instance:
 *
 *     SetupDataSource  -> the instance's HeapprofdConfig onto a svc_config (refused with
 *                         a message when invalid)
 *     StartDataSource  -> a session writing into the instance's SMB writer
 *     StopDataSource   -> the session ends on its own thread (final dumps), then the
 *                         writer's last chunk is committed and the stop acknowledged
 *     traced gone      -> every session ends (its packets are dropped), reconnection
 *
 * One thread (this one) owns the producer connection, the daemon socket and the
 * signals; it never waits for SMB space (the sessions' bookkeeping threads do).
 */
#include "cli/cli.h"

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include "bookkeeping/bookkeeping.h"
#include "common/clock.h"
#include "common/containers.h"
#include "common/log.h"
#include "producer/producer.h"

/* The SMB heapprofd asks traced for (traced's default is 256 KiB in 4 KiB pages; a trace
 * config's producers{} entry still decides): a dump is tens of megabytes written at
 * once, and through 64 chunks of 4 KiB it spends most of its time waiting for commit
 * round trips (bench: producer_dump_vs_file_ratio 2.1-2.7 there, 1.1-1.6 with this). */
#define SMB_SIZE_HINT (1u << 20)
#define SMB_PAGE_HINT (16u << 10)
/* How long a Ctrl-C waits for the sessions' final dumps and acks. */
#define QUIT_GRACE_MS 10000
#define MAX_POLL 64

struct ds_instance {
    uint64_t id;  /* traced's instance id (restarts with traced) */
    uint64_t key; /* its session's id in the service: unique for the daemon's life */
    prod_writer_t *w;
    struct svc_config cfg; /* until the session takes it */
    struct bk_sink sink;
    uint32_t stop_timeout_ms;
    bool started;  /* a session runs for it */
    bool stopping; /* its session is ending */
    bool orphan;   /* the connection it belonged to is gone: no ack */
    uint64_t stop_ns;
    _Atomic bool ended; /* set by the session's stop thread */
    struct producer *pr;
};

struct producer {
    const struct cli_producer_opts *o;
    prod_t *p;
    svc_multi_t *m;
    int sig_fd; /* SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1 */
    int wake_fd;
    struct ds_instance **inst;
    size_t n_inst, cap_inst;
    uint64_t next_key;
};

static struct ds_instance *find(struct producer *pr, uint64_t id)
{
    for (size_t i = 0; i < pr->n_inst; i++)
        if (pr->inst[i]->id == id && !pr->inst[i]->orphan)
            return pr->inst[i];
    return NULL;
}

static void instance_free(struct producer *pr, struct ds_instance *in)
{
    for (size_t i = 0; i < pr->n_inst; i++) {
        if (pr->inst[i] == in) {
            pr->inst[i] = pr->inst[--pr->n_inst];
            break;
        }
    }
    prod_writer_unref(in->w);
    svc_config_done(&in->cfg);
    free(in);
}

static int sink_write(void *ctx, const struct iovec *iov, int n, size_t len)
{
    struct ds_instance *in = ctx;
    return prod_writer_write(in->w, iov, n, len);
}

static bool sink_clear(void *ctx)
{
    struct ds_instance *in = ctx;
    return prod_writer_take_clear_request(in->w);
}

/* Copies the daemon's own settings (heapprof's fields, not HeapprofdConfig's) into a
 * session's configuration. */
static void apply_base(struct svc_config *cfg, const struct svc_config *base)
{
    for (size_t i = 0; i < svc_n_config_fields; i++) {
        const struct svc_config_field *f = &svc_config_fields[i];
        if (f->proto_id == 0 &&
            (f->type == SVC_FIELD_BOOL || f->type == SVC_FIELD_UINT || f->type == SVC_FIELD_BYTES))
            memcpy((char *)cfg + f->offset, (const char *)base + f->offset,
                   f->type == SVC_FIELD_BOOL ? sizeof(bool) : f->width);
    }
    cfg->no_source_lines = base->no_source_lines;
    cfg->log_processes = base->log_processes;
}

static int on_setup(void *ctx, const struct prod_ds_config *dc, prod_writer_t *w)
{
    struct producer *pr = ctx;
    struct ds_instance *in = calloc(1, sizeof(*in));
    if (!in || hp_grow((void **)&pr->inst, &pr->cap_inst, pr->n_inst + 1, sizeof(*pr->inst)) < 0) {
        free(in);
        hp_log_error("instance %llu: out of memory", (unsigned long long)dc->instance_id);
        return -ENOMEM;
    }
    in->id = dc->instance_id;
    in->key = ++pr->next_key;
    in->pr = pr;
    in->stop_timeout_ms = dc->stop_timeout_ms ? dc->stop_timeout_ms : 5000;
    atomic_init(&in->ended, false);
    svc_config_init(&in->cfg);
    apply_base(&in->cfg, pr->o->base);
    char err[256];
    int r = svc_config_from_proto(dc->heapprofd_config, dc->heapprofd_config_len, &in->cfg, err,
                                  sizeof(err));
    if (r == 0 && err[0])
        hp_log_warn("instance %llu: %s", (unsigned long long)in->id, err);
    if (r == 0 && !svc_config_has_targets(&in->cfg)) {
        snprintf(err, sizeof(err),
                 "heapprofd_config names no process (pid, process_cmdline or all)");
        r = -EINVAL;
    }
    if (r == 0)
        r = svc_config_check(&in->cfg, err, sizeof(err));
    if (r < 0) {
        hp_log_error("instance %llu refused: %s", (unsigned long long)in->id, err);
        svc_config_done(&in->cfg);
        free(in);
        return r;
    }
    in->w = prod_writer_ref(w);
    in->sink = (struct bk_sink){sink_write, sink_clear, in};
    pr->inst[pr->n_inst++] = in;
    hp_log_info("instance %llu: set up (%zu pids, %zu process names%s, interval %llu)",
                (unsigned long long)in->id, in->cfg.n_pid, in->cfg.n_process_cmdline,
                in->cfg.all ? ", all" : "", (unsigned long long)in->cfg.sampling_interval_bytes);
    return 0;
}

static void on_start(void *ctx, uint64_t id)
{
    struct producer *pr = ctx;
    struct ds_instance *in = find(pr, id);
    if (!in || in->started)
        return;
    int r = svc_multi_start(pr->m, in->key, &in->cfg, &in->sink);
    if (r < 0) {
        hp_log_error("instance %llu: cannot start profiling: %s", (unsigned long long)id,
                     strerror(-r));
        return;
    }
    in->started = true;
    hp_log_info("instance %llu: profiling", (unsigned long long)id);
}

/* On the session's stop thread: its last packet is written. */
static void on_session_ended(void *ctx, uint64_t id)
{
    struct ds_instance *in = ctx;
    (void)id;
    prod_writer_finish(in->w);
    atomic_store_explicit(&in->ended, true, memory_order_release);
    uint64_t one = 1;
    (void)!write(in->pr->wake_fd, &one, sizeof(one));
}

static void stop_instance(struct producer *pr, struct ds_instance *in)
{
    if (in->stopping)
        return;
    in->stopping = true;
    in->stop_ns = hp_clock_ns(CLOCK_MONOTONIC);
    if (!in->started || svc_multi_stop(pr->m, in->key, on_session_ended, in) < 0) {
        /* Nothing runs: done at once. */
        prod_writer_finish(in->w);
        atomic_store_explicit(&in->ended, true, memory_order_release);
        uint64_t one = 1;
        (void)!write(pr->wake_fd, &one, sizeof(one));
    }
}

static void on_stop(void *ctx, uint64_t id)
{
    struct producer *pr = ctx;
    struct ds_instance *in = find(pr, id);
    if (in)
        stop_instance(pr, in);
}

static void on_disconnected(void *ctx)
{
    struct producer *pr = ctx;
    /* traced is gone and with it every instance: end the sessions (their last packets
     * have nowhere to go) and forget them once ended. */
    for (size_t i = 0; i < pr->n_inst; i++) {
        struct ds_instance *in = pr->inst[i];
        in->orphan = true;
        stop_instance(pr, in);
    }
}

/* Acknowledges the instances whose sessions have ended. */
static void reap(struct producer *pr)
{
    uint64_t v;
    (void)!read(pr->wake_fd, &v, sizeof(v));
    for (size_t i = 0; i < pr->n_inst;) {
        struct ds_instance *in = pr->inst[i];
        if (!atomic_load_explicit(&in->ended, memory_order_acquire)) {
            i++;
            continue;
        }
        uint64_t ms = (hp_clock_ns(CLOCK_MONOTONIC) - in->stop_ns) / 1000000;
        struct prod_writer_stats ws;
        prod_writer_get_stats(in->w, &ws);
        if (ws.packets_dropped)
            hp_log_warn("instance %llu: %llu packets dropped (shared memory buffer full)",
                        (unsigned long long)in->id, (unsigned long long)ws.packets_dropped);
        if (!in->orphan && pr->p) {
            if (ms > in->stop_timeout_ms)
                hp_log_warn("instance %llu: final dumps took %llu ms, past traced's stop "
                            "timeout of %u ms: they may be missing from the trace",
                            (unsigned long long)in->id, (unsigned long long)ms,
                            in->stop_timeout_ms);
            prod_instance_stopped(pr->p, in->id);
            hp_log_info("instance %llu: stopped after %llu ms (%llu packets, %llu bytes)",
                        (unsigned long long)in->id, (unsigned long long)ms,
                        (unsigned long long)ws.packets, (unsigned long long)ws.bytes);
        }
        instance_free(pr, in);
    }
}

/* Opens what the daemon serves on: the signalfd, the wake eventfd, the daemon socket and
 * the producer connection to traced. Returns 0, or -1 after a message on stderr. */
static int producer_open(struct producer *pr)
{
    const struct cli_producer_opts *o = pr->o;
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    sigaddset(&sigs, SIGHUP);
    sigaddset(&sigs, SIGQUIT);
    sigaddset(&sigs, SIGUSR1);
    pr->sig_fd = signalfd(-1, &sigs, SFD_CLOEXEC | SFD_NONBLOCK);
    pr->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (pr->sig_fd < 0 || pr->wake_fd < 0) {
        fprintf(stderr, "heapprofd: %s\n", strerror(errno));
        return -1;
    }
    int r = svc_multi_new(o->daemon_socket, &pr->m);
    if (r < 0) {
        fprintf(stderr, "heapprofd: cannot listen on %s: %s\n", o->daemon_socket,
                r == -EADDRINUSE ? "another heapprofd is already running on that socket"
                                 : strerror(-r));
        return -1;
    }
    struct prod_callbacks cb = {
        .setup = on_setup, .start = on_start, .stop = on_stop, .disconnected = on_disconnected};
    r = prod_new(
        &(struct prod_options){
            .socket_name = o->producer_socket,
            .data_source_name = o->data_source,
            .smb_size_hint_bytes = o->smb_size_hint_bytes ? o->smb_size_hint_bytes : SMB_SIZE_HINT,
            .smb_page_size_hint_bytes =
                o->smb_page_size_hint_bytes ? o->smb_page_size_hint_bytes : SMB_PAGE_HINT},
        &cb, pr, &pr->p);
    if (r < 0) {
        fprintf(stderr, "heapprofd: %s\n", strerror(-r));
        return -1;
    }
    return 0;
}

/* Takes the pending signals: SIGUSR1 dumps every session now; the first stop signal
 * stops every instance and sets @quit_deadline, a second one exits at once. */
static void take_signals(struct producer *pr, uint64_t *quit_deadline)
{
    struct signalfd_siginfo si;
    while (read(pr->sig_fd, &si, sizeof(si)) == (ssize_t)sizeof(si)) {
        if (si.ssi_signo == SIGUSR1) {
            svc_multi_dump_now(pr->m);
        } else if (*quit_deadline) {
            fprintf(stderr, "heapprofd: interrupted again; exiting now\n");
            _exit(130);
        } else {
            fprintf(stderr, "heapprofd: stopping (signal %u): final dumps of every session\n",
                    si.ssi_signo);
            *quit_deadline = hp_clock_ns(CLOCK_MONOTONIC) + QUIT_GRACE_MS * 1000000ull;
            for (size_t i = 0; i < pr->n_inst; i++)
                stop_instance(pr, pr->inst[i]);
        }
    }
}

/* Serves traced and the profiled processes until, after a stop signal, every instance is
 * acknowledged or the grace period is over; or until poll() fails. */
static void serve(struct producer *pr)
{
    uint64_t quit_deadline = 0;
    for (;;) {
        struct pollfd fds[MAX_POLL];
        size_t n = 0;
        fds[n++] = (struct pollfd){pr->sig_fd, POLLIN, 0};
        fds[n++] = (struct pollfd){pr->wake_fd, POLLIN, 0};
        n += prod_pollfds(pr->p, fds + n);
        n += svc_multi_pollfds(pr->m, fds + n, MAX_POLL - n);
        int t1 = prod_timeout_ms(pr->p), t2 = svc_multi_timeout_ms(pr->m);
        int t = t1 < 0 ? t2 : t2 < 0 ? t1 : HP_MIN(t1, t2);
        if (t < 0 || t > 1000)
            t = 1000;
        if (poll(fds, n, t) < 0 && errno != EINTR) {
            fprintf(stderr, "heapprofd: poll: %s\n", strerror(errno));
            return;
        }
        take_signals(pr, &quit_deadline);
        prod_dispatch(pr->p);
        svc_multi_dispatch(pr->m);
        reap(pr);
        prod_dispatch(pr->p); /* the acks just queued */
        if (quit_deadline && (pr->n_inst == 0 || hp_clock_ns(CLOCK_MONOTONIC) > quit_deadline))
            return;
    }
}

int cli_producer_run(const struct cli_producer_opts *o)
{
    struct producer pr = {.o = o, .sig_fd = -1, .wake_fd = -1};
    int rc = EXIT_PROFILER;
    cli_loop_block_signals(NULL);
    if (producer_open(&pr) < 0)
        goto out;
    fprintf(stderr,
            "heapprofd: data source %s of the tracing service at %s; processes connect to %s\n",
            o->data_source ? o->data_source : "android.heapprofd", prod_socket_name(pr.p),
            o->daemon_socket);
    if (o->started)
        o->started(o->ctx);
    serve(&pr);
    rc = 0;
out:
    pr.p = prod_free(pr.p);
    pr.m = svc_multi_free(pr.m); /* waits for the sessions still ending */
    reap(&pr);
    while (pr.n_inst)
        instance_free(&pr, pr.inst[0]);
    free(pr.inst);
    if (pr.sig_fd >= 0)
        (void)close(pr.sig_fd);
    if (pr.wake_fd >= 0)
        (void)close(pr.wake_fd);
    return rc;
}
