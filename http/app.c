/* http/app.c: the pages of heapprofd's endpoint (http/http.h) on the generic server
 * (http/server.h). A request that needs the profiles becomes a job: a query to the
 * bookkeeping thread (svc_query()) answered into a memfd, its outcome signalled on an
 * eventfd the server polls; then the answer is read here, on the server's thread:
 *
 *     /debug/pprof/heap?pid=N     PROFILE(N) -> trace -> rp_trace_load_buffer -> pprof
 *     /debug/pprof/heap?name=X    PROCESSES -> the one match -> PROFILE(pid) -> ...
 *     /                           PROCESSES -> HTML table
 */
#include "http/http.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/format.h"
#include "http/server.h"
#include "report/report.h"

struct http_endpoint {
    svc_t *svc;
    http_server_t *srv;
};

enum job_kind {
    JOB_PROFILE,  /* the profile of pid */
    JOB_BY_NAME,  /* the processes, to find the one name matches; then JOB_PROFILE */
    JOB_PROCESSES /* the processes, for the index page */
};

struct job {
    enum job_kind kind;
    /* the pprof default: "inuse_space" or "alloc_space"; HTML_VIEW: the page instead */
    const char *sample_type;
    pid_t pid;
    char name[256];
    int out_fd;  /* memfd the answer is written to */
    int done_fd; /* eventfd: answered */
};

static void job_free(struct job *j)
{
    if (!j)
        return;
    if (j->out_fd >= 0)
        (void)close(j->out_fd);
    if (j->done_fd >= 0)
        (void)close(j->done_fd);
    free(j);
}

/* Asks the query of @j: 0, or -errno with @resp filled. */
static int job_ask(struct http_endpoint *h, struct job *j, struct http_response *resp)
{
    if (j->out_fd >= 0)
        (void)close(j->out_fd);
    if (j->done_fd >= 0)
        (void)close(j->done_fd);
    j->out_fd = memfd_create("heapprof-http", MFD_CLOEXEC);
    j->done_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    int r = j->out_fd < 0 || j->done_fd < 0 ? -errno : 0;
    if (r == 0)
        r = svc_query(h->svc, j->kind == JOB_PROFILE ? SVC_QUERY_PROFILE : SVC_QUERY_PROCESSES,
                      j->pid, j->out_fd, j->done_fd);
    if (r == -EBUSY) {
        http__respond_text(resp, 503, "busy: too many profiles asked for at once; try again");
        resp->extra_headers = "Retry-After: 1\r\n";
    } else if (r < 0) {
        http__respond_text(resp, 500, "cannot ask for the profile: %s", strerror(-r));
    }
    return r;
}

/* The whole content of memfd @fd, mapped (munmap @ret_len bytes), or NULL when empty or
 * on error (*@ret_len 0). */
static void *map_answer(int fd, size_t *ret_len)
{
    struct stat st;
    *ret_len = 0;
    if (fstat(fd, &st) < 0 || st.st_size <= 0)
        return NULL;
    void *p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED)
        return NULL;
    *ret_len = (size_t)st.st_size;
    return p;
}

/* ---- the profile: trace -> pprof ---- */

/* The process of @t to serve: @pid's libc.malloc heap, else its first. */
static const struct rp_trace_process *pick_process(const struct rp_trace *t, pid_t pid)
{
    const struct rp_trace_process *first = NULL;
    for (size_t i = 0; i < t->n_processes; i++) {
        const struct rp_trace_process *p = &t->processes[i];
        if (p->pid != pid || !p->selected)
            continue;
        if (!first)
            first = p;
        if (p->heap_name && strcmp(p->heap_name, "libc.malloc") == 0)
            return p;
    }
    return first;
}

/* The pprof of the trace in @trace (@len bytes) into @resp. */
static void respond_pprof(const struct job *j, const void *trace, size_t len,
                          struct http_response *resp)
{
    struct rp_trace *t = NULL;
    int r = rp_trace_load_buffer(trace, len, &(struct rp_trace_options){.pid = j->pid}, &t);
    const struct rp_trace_process *p = r == 0 ? pick_process(t, j->pid) : NULL;
    int fd = p ? memfd_create("heapprof-pprof", MFD_CLOEXEC) : -1;
    if (p && fd >= 0) {
        struct rp_trace_dump d = {.timestamp = p->timestamp,
                                  .sampling_interval_bytes = p->sampling_interval_bytes,
                                  .n_callsites = p->n_callsites,
                                  .callsites = p->callsites};
        r = rp_pprof_write_dump_as(p, &d, j->sample_type, fd);
    } else if (r == 0) {
        r = p ? -errno : -ENODATA;
    }
    size_t n = 0;
    void *m = r == 0 ? map_answer(fd, &n) : NULL;
    char *body = m ? malloc(n) : NULL;
    if (body) {
        memcpy(body, m, n);
        *resp = (struct http_response){.status = 200,
                                       .content_type = "application/octet-stream",
                                       .extra_headers = "Content-Disposition: attachment; "
                                                        "filename=\"profile\"\r\n",
                                       .body = body,
                                       .body_len = n};
    } else {
        http__respond_text(resp, 500, "cannot make the profile of pid %d: %s", (int)j->pid,
                           strerror(r < 0 ? -r : ENOMEM));
    }
    if (m)
        munmap(m, n);
    if (fd >= 0)
        (void)close(fd);
    rp_trace_free(t);
}

/* /html?pid=N: `heapprof html` of the process's profile now (the snapshot has its
 * latest state as one dump). */
static const char HTML_VIEW[] = "html";

static void respond_html(const struct job *j, const void *trace, size_t len,
                         struct http_response *resp)
{
    struct rp_trace *t = NULL;
    int r = rp_trace_load_buffer(trace, len, &(struct rp_trace_options){.pid = j->pid}, &t);
    char *body = NULL;
    size_t n = 0;
    FILE *f = r == 0 ? open_memstream(&body, &n) : NULL;
    char title[64];
    snprintf(title, sizeof(title), "pid %d, live from heapprofd", (int)j->pid);
    if (f) {
        r = rp_html_write(f, t, NULL, &(struct rp_html_options){.demangle = true, .title = title});
        if (fclose(f) != 0 && r >= 0)
            r = -EIO;
    }
    if (r >= 0 && body) {
        *resp = (struct http_response){
            .status = 200, .content_type = "text/html; charset=utf-8", .body = body, .body_len = n};
    } else {
        free(body);
        http__respond_text(resp, 500, "cannot make the page of pid %d: %s", (int)j->pid,
                           strerror(r < 0 ? -r : ENOMEM));
    }
    rp_trace_free(t);
}

/* ---- the processes ---- */

/* The processes answered in @j's memfd: mapped, *@ret_n of them (munmap *@ret_bytes). */
static const struct svc_proc_info *map_processes(const struct job *j, size_t *ret_n,
                                                 size_t *ret_bytes)
{
    const struct svc_proc_info *v = map_answer(j->out_fd, ret_bytes);
    *ret_n = v ? *ret_bytes / sizeof(*v) : 0;
    return v;
}

/* True when @name finds @info as heapprofd's -n would. */
static bool name_matches(const char *name, const struct svc_proc_info *info)
{
    struct svc_config cfg;
    svc_config_init(&cfg);
    cfg.process_cmdline[0] = (char *)name; /* borrowed: not given to svc_config_done() */
    cfg.n_process_cmdline = 1;
    char comm[SVC_COMM_LEN];
    const char *c = svc_proc_comm(info->pid, comm, sizeof(comm));
    return svc_config_matches(&cfg, info->pid, c, info->cmdline, info->cmdline_len);
}

/* JOB_BY_NAME answered: turns @j into the profile of the one match (0), or fills @resp. */
static int resolve_name(struct http_endpoint *h, struct job *j, struct http_response *resp)
{
    size_t n, bytes;
    const struct svc_proc_info *v = map_processes(j, &n, &bytes);
    char pids[256] = "";
    size_t matches = 0, used = 0;
    for (size_t i = 0; i < n; i++) {
        if (!name_matches(j->name, &v[i]))
            continue;
        if (matches++ == 0)
            j->pid = v[i].pid;
        if (used < sizeof(pids) - 16)
            used += (size_t)snprintf(pids + used, sizeof(pids) - used, "%s%d", used ? ", " : "",
                                     (int)v[i].pid);
    }
    if (v)
        munmap((void *)v, bytes);
    if (matches == 0) {
        http__respond_text(resp, 404, "no profiled process matches '%s' (the processes: /)",
                           j->name);
        return -ENOENT;
    }
    if (matches > 1) {
        http__respond_text(resp, 400, "'%s' matches %zu processes (pids %s): ask with ?pid=N",
                           j->name, matches, pids);
        return -EEXIST;
    }
    j->kind = JOB_PROFILE;
    return job_ask(h, j, resp);
}

/* Appends @s to @buf with HTML's special characters escaped. */
static void put_escaped(FILE *f, const char *s)
{
    for (; *s; s++) {
        switch (*s) {
        case '&':
            fputs("&amp;", f);
            break;
        case '<':
            fputs("&lt;", f);
            break;
        case '>':
            fputs("&gt;", f);
            break;
        case '"':
            fputs("&quot;", f);
            break;
        case '\'':
            fputs("&#39;", f);
            break;
        default:
            fputc(*s, f);
        }
    }
}

static const char page_head[] =
    "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>heapprofd</title>\n"
    "<style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}"
    "td,th{padding:.2em .8em;text-align:left}td.n{text-align:right}"
    "tr:nth-child(even){background:#f3f3f3}</style></head><body>\n";

static void put_process_row(FILE *f, const struct svc_proc_info *p)
{
    char title[512], live[32], alloc[32];
    svc_cmdline_title(p->cmdline, p->cmdline_len, title, sizeof(title));
    fprintf(f, "<tr><td class=n>%d</td><td>", (int)p->pid);
    put_escaped(f, title[0] ? title : "?");
    fprintf(f,
            "</td><td class=n>%llu</td><td class=n>%s</td><td class=n>%s</td>"
            "<td><a href=\"/debug/pprof/heap?pid=%d\">heap</a> "
            "<a href=\"/debug/pprof/allocs?pid=%d\">allocs</a>",
            (unsigned long long)p->samples, hp_format_bytes(p->live_bytes, live, sizeof(live)),
            hp_format_bytes(p->allocated_bytes, alloc, sizeof(alloc)), (int)p->pid, (int)p->pid);
    fprintf(f, " <a href=\"/html?pid=%d\">html</a>", (int)p->pid);
    fputs("</td></tr>\n", f);
}

/* The index page: one row per process profiled. */
static void respond_index(const struct job *j, struct http_response *resp)
{
    size_t n, bytes;
    const struct svc_proc_info *v = map_processes(j, &n, &bytes);
    char *body = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&body, &len);
    if (f) {
        fputs(page_head, f);
        fprintf(f,
                "<h1>heapprofd</h1>\n<p>%zu process%s profiled. Each profile is taken when "
                "asked for: <code>go tool pprof http://HOST:PORT/debug/pprof/heap?pid=N</code>"
                "</p>\n<table>\n<tr><th>pid</th><th>process</th><th>samples</th>"
                "<th>unreleased</th><th>allocated</th><th>profiles</th></tr>\n",
                n, n == 1 ? " is" : "es are");
        for (size_t i = 0; i < n; i++)
            put_process_row(f, &v[i]);
        fputs("</table>\n<p>Sampled bytes, as the profiles show them. "
              "<a href=\"/debug/pprof/\">/debug/pprof/</a></p>\n</body></html>\n",
              f);
    }
    if (v)
        munmap((void *)v, bytes);
    if (!f || fclose(f) != 0 || !body) {
        free(body);
        http__respond_text(resp, 500, "out of memory");
        return;
    }
    *resp = (struct http_response){
        .status = 200, .content_type = "text/html; charset=utf-8", .body = body, .body_len = len};
}

/* /debug/pprof/: the profiles served, as Go's index lists its own. */
static void respond_pprof_index(struct http_response *resp)
{
    static const char page[] =
        "<p>Profiles of the processes heapprofd profiles, each taken when asked for; name the "
        "process with <code>?pid=N</code> or <code>?name=NAME</code> (the processes: "
        "<a href=\"/\">/</a>).</p>\n<table>\n"
        "<tr><td><a href=\"/debug/pprof/allocs\">allocs</a></td><td>the sampled allocations "
        "since the process started (default: alloc_space)</td></tr>\n"
        "<tr><td><a href=\"/debug/pprof/heap\">heap</a></td><td>the same profile, by what is "
        "still allocated (default: inuse_space)</td></tr>\n</table>\n</body></html>\n";
    size_t hl = sizeof(page_head) - 1, pl = sizeof(page) - 1;
    char *body = malloc(hl + pl);
    if (!body) {
        http__respond_text(resp, 500, "out of memory");
        return;
    }
    memcpy(body, page_head, hl);
    memcpy(body + hl, page, pl);
    *resp = (struct http_response){.status = 200,
                                   .content_type = "text/html; charset=utf-8",
                                   .body = body,
                                   .body_len = hl + pl};
}

/* ---- requests ---- */

/* A query parameter that must be absent or "0" (Go's handlers take them). 0, or -1 with
 * @resp filled. */
static int refuse_param(const struct http_request *req, const char *name, const char *why,
                        struct http_response *resp)
{
    char v[32];
    int r = http_query_get(req->query, req->query_len, name, v, sizeof(v));
    if (r == 0 || (r > 0 && strcmp(v, "0") == 0))
        return 0;
    http__respond_text(resp, 400, "%s", why);
    return -1;
}

/* Which process ?pid= or ?name= asks for, into @j. 0, or -1 with @resp filled. */
static int parse_target(const struct http_request *req, struct job *j, struct http_response *resp)
{
    char pid[32];
    int rp = http_query_get(req->query, req->query_len, "pid", pid, sizeof(pid));
    int rn = http_query_get(req->query, req->query_len, "name", j->name, sizeof(j->name));
    const char *why = NULL;
    if (rp < 0 || rn < 0)
        why = "malformed query: give ?pid=N or ?name=NAME once, percent-encoded";
    else if (rp == 0 && rn == 0)
        why = "which process? add ?pid=N or ?name=NAME (the processes: /)";
    else if (rp > 0 && rn > 0)
        why = "give ?pid=N or ?name=NAME, not both";
    else if (rn > 0 && !j->name[0])
        why = "?name= is empty";
    if (!why && rp > 0) {
        char *end;
        errno = 0;
        long v = strtol(pid, &end, 10);
        if (!pid[0] || *end || errno || v <= 0 || v > INT32_MAX || pid[0] == '+' || pid[0] == ' ')
            why = "?pid= is not a process id (a positive decimal number)";
        j->pid = (pid_t)v;
    }
    if (why) {
        http__respond_text(resp, 400, "%s", why);
        return -1;
    }
    j->kind = rp > 0 ? JOB_PROFILE : JOB_BY_NAME;
    return 0;
}

/* Starts @j (taken) or frees it after filling @resp: 1 or 0, as http_app.start(). */
static int begin_job(struct http_endpoint *h, struct job *j, struct http_response *resp,
                     void **ret_job, int *ret_fd)
{
    if (job_ask(h, j, resp) < 0) {
        job_free(j);
        return 0;
    }
    *ret_job = j;
    *ret_fd = j->done_fd;
    return 1;
}

static struct job *job_new(void)
{
    struct job *j = calloc(1, sizeof(*j));
    if (j)
        j->out_fd = j->done_fd = -1;
    return j;
}

static int start_profile(struct http_endpoint *h, const struct http_request *req,
                         const char *sample_type, struct http_response *resp, void **ret_job,
                         int *ret_fd)
{
    if (refuse_param(req, "seconds",
                     "delta profiles (?seconds=N) are not served: each request gets the "
                     "profile as it stands (leave seconds out, or set delta off)",
                     resp) < 0 ||
        refuse_param(req, "debug", "only the binary pprof format is served (debug=0)", resp) < 0)
        return 0;
    struct job *j = job_new();
    if (!j) {
        http__respond_text(resp, 500, "out of memory");
        return 0;
    }
    j->sample_type = sample_type;
    if (parse_target(req, j, resp) < 0) {
        job_free(j);
        return 0;
    }
    return begin_job(h, j, resp, ret_job, ret_fd);
}

static int app_start(void *ctx, const struct http_request *req, struct http_response *resp,
                     void **ret_job, int *ret_fd)
{
    struct http_endpoint *h = ctx;
    if (req->method == HTTP_METHOD_OTHER) {
        http__respond_text(resp, 405, "only GET and HEAD are served");
        resp->extra_headers = "Allow: GET, HEAD\r\n";
        return 0;
    }
    if (http_path_is(req, "/debug/pprof/heap"))
        return start_profile(h, req, "inuse_space", resp, ret_job, ret_fd);
    if (http_path_is(req, "/debug/pprof/allocs"))
        return start_profile(h, req, "alloc_space", resp, ret_job, ret_fd);
    if (http_path_is(req, "/debug/pprof/") || http_path_is(req, "/debug/pprof")) {
        respond_pprof_index(resp);
        return 0;
    }
    if (http_path_is(req, "/")) {
        struct job *j = job_new();
        if (!j) {
            http__respond_text(resp, 500, "out of memory");
            return 0;
        }
        j->kind = JOB_PROCESSES;
        return begin_job(h, j, resp, ret_job, ret_fd);
    }
    if (http_path_is(req, "/html"))
        return start_profile(h, req, HTML_VIEW, resp, ret_job, ret_fd);
    http__respond_text(resp, 404, "no such page: %.*s (the processes: /)",
                       (int)HP_MIN(req->path_len, (size_t)200), req->path);
    return 0;
}

static int app_step(void *ctx, void *job, struct http_response *resp, int *ret_fd)
{
    struct http_endpoint *h = ctx;
    struct job *j = job;
    int r = svc_query_result(j->done_fd);
    if (r == -EAGAIN) {
        *ret_fd = j->done_fd;
        return 1;
    }
    if (r == -ESRCH && j->kind == JOB_PROFILE) {
        http__respond_text(resp, 404, "pid %d is not profiled (the processes: /)", (int)j->pid);
    } else if (r < 0) {
        http__respond_text(resp, 500, "the service could not answer: %s", strerror(-r));
    } else if (j->kind == JOB_BY_NAME) {
        if (resolve_name(h, j, resp) == 0) {
            *ret_fd = j->done_fd;
            return 1;
        }
    } else if (j->kind == JOB_PROCESSES) {
        respond_index(j, resp);
    } else {
        size_t n;
        void *m = map_answer(j->out_fd, &n);
        if (j->sample_type == HTML_VIEW)
            respond_html(j, m, n, resp);
        else
            respond_pprof(j, m, n, resp);
        if (m)
            munmap(m, n);
    }
    job_free(j);
    return 0;
}

static void app_cancel(void *ctx, void *job)
{
    (void)ctx;
    job_free(job);
}

int http_endpoint_start(int listen_fd, svc_t *s, http_endpoint_t **ret)
{
    struct http_endpoint *h = calloc(1, sizeof(*h));
    if (!h) {
        (void)close(listen_fd);
        return -ENOMEM;
    }
    h->svc = s;
    struct http_app app = {.start = app_start, .step = app_step, .cancel = app_cancel, .ctx = h};
    int r = http__server_start(listen_fd, &app, &h->srv);
    if (r < 0) {
        free(h);
        return r;
    }
    *ret = h;
    return 0;
}

http_endpoint_t *http_endpoint_stop(http_endpoint_t *h)
{
    if (!h)
        return NULL;
    h->srv = http__server_stop(h->srv);
    free(h);
    return NULL;
}
