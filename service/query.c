/* service/query.c: questions other threads ask the bookkeeping thread about the
 * profiles (svc_query(), service/svc.h): posted as messages like any other, so the
 * bookkeeping thread stays the only one that touches profile state, answered into the
 * asker's descriptor, and the outcome signalled on its eventfd. */
#include "service/svc_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/log.h"

int svc_query(svc_t *s, enum svc_query_kind kind, pid_t pid, int out_fd, int done_fd)
{
    if (kind != SVC_QUERY_PROFILE && kind != SVC_QUERY_PROCESSES)
        return -EINVAL;
    /* What the processes did until now is in the answer: the records in their rings, and
     * the frees they hold in batches. */
    svc__sync_unwinders(s);
    /* Counted before posting: the answer (which takes it back) may come at once. */
    unsigned n = atomic_fetch_add_explicit(&s->queries, 1, memory_order_relaxed);
    if (n >= SVC_MAX_QUERIES) {
        atomic_fetch_sub_explicit(&s->queries, 1, memory_order_relaxed);
        return -EBUSY;
    }
    int out = fcntl(out_fd, F_DUPFD_CLOEXEC, 3);
    int done = out < 0 ? -1 : fcntl(done_fd, F_DUPFD_CLOEXEC, 3);
    int r = done < 0 ? -errno : 0;
    /* A batcher of this call's own: svc__bkq_post() is the thread-safe part. */
    struct svc_batcher b = {.q = &s->bkq};
    struct svc_msg_query *m =
        r == 0 ? svc__batch_add(&b, SVC_MSG_QUERY, (pid_t)pid, sizeof(*m)) : NULL;
    if (!m) {
        if (out >= 0)
            (void)close(out);
        if (done >= 0)
            (void)close(done);
        free(b.cur);
        atomic_fetch_sub_explicit(&s->queries, 1, memory_order_relaxed);
        return r < 0 ? r : -ENOMEM;
    }
    m->kind = kind;
    m->out_fd = out;
    m->done_fd = done;
    svc__batch_post(&b);
    return 0;
}

int svc_query_result(int done_fd)
{
    uint64_t v;
    ssize_t n = read(done_fd, &v, sizeof(v));
    if (n < 0)
        return errno == EINTR ? -EAGAIN : -errno;
    if (n != (ssize_t)sizeof(v) || v == 0)
        return -EIO;
    return v == 1 ? 0 : -(int)(v - 1);
}

static int write_all(int fd, const void *p, size_t len)
{
    const char *c = p;
    while (len) {
        ssize_t w = write(fd, c, len);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return w < 0 ? -errno : -EIO;
        c += w;
        len -= (size_t)w;
    }
    return 0;
}

/* The cmdline of @ps in @info, cut after its last whole argument that fits. */
static void copy_cmdline(struct svc_proc_info *info, const struct bk_proc_summary *ps)
{
    size_t n = ps->cmdline_len;
    if (n > sizeof(info->cmdline)) {
        n = sizeof(info->cmdline);
        while (n > 0 && ps->cmdline[n - 1] != '\0')
            n--;
    }
    memcpy(info->cmdline, ps->cmdline, n);
    info->cmdline_len = (uint32_t)n;
}

static int answer_processes(struct svc *s, int fd)
{
    size_t n = bk_n_processes(s->bk);
    for (size_t i = 0; i < n; i++) {
        struct bk_proc_summary ps;
        bk_process_summary(s->bk, i, &ps);
        struct svc_proc_info info;
        memset(&info, 0, sizeof(info));
        info.pid = ps.pid;
        info.samples = ps.samples;
        info.allocated_bytes = ps.allocated_bytes;
        info.live_bytes = ps.live_bytes;
        copy_cmdline(&info, &ps);
        int r = write_all(fd, &info, sizeof(info));
        if (r < 0)
            return r;
    }
    return 0;
}

void svc__answer_query(struct svc *s, const struct svc_msg_query *q)
{
    int r = q->kind == SVC_QUERY_PROFILE ? bk_snapshot_process(s->bk, q->h.pid, q->out_fd)
                                         : answer_processes(s, q->out_fd);
    if (r < 0 && r != -ESRCH)
        hp_log_warn("answering a query about the profiles: %s", strerror(-r));
    uint64_t v = 1 + (uint64_t)(r < 0 ? -r : 0);
    (void)close(q->out_fd);
    if (write(q->done_fd, &v, sizeof(v)) != (ssize_t)sizeof(v))
        hp_log_debug("query answer not signalled: %s", strerror(errno));
    (void)close(q->done_fd);
    atomic_fetch_sub_explicit(&s->queries, 1, memory_order_relaxed);
}
