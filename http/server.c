/* http/server.c: the connections of the HTTP server (http/server.h), each a small state
 * machine driven by one poll() loop:
 *
 *     READING --head parsed--> QUEUED --job slot--> WAITING --job done--> WRITING
 *        |  \--bad head, or deadline: an error answer ----------------------^  |
 *        \--EOF: closed                                   all sent: DRAINING --+--> closed
 *
 * Every state but QUEUED has a deadline; nothing blocks (sockets are non-blocking, the
 * application's slow work waits on a descriptor in the same poll). DRAINING reads what
 * the client still sends (a body we ignore) for a moment after our answer, so that
 * closing with unread bytes does not reset the connection before the client read it. */
#include "http/server.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/log.h"

/* Time for the client to read what it still sends after our answer. */
#define DRAIN_MS 1000
/* Accepting stops this long when out of descriptors (the listening socket stays readable). */
#define ACCEPT_PAUSE_MS 100

enum conn_state { CONN_READING, CONN_QUEUED, CONN_WAITING, CONN_WRITING, CONN_DRAINING };

struct conn {
    int fd; /* -1: closed, removed at the end of the loop's pass */
    enum conn_state st;
    uint64_t accepted_ms, deadline_ms, queued_seq;
    char *in; /* HTTP_MAX_HEAD bytes */
    size_t in_len;
    struct http_request req; /* points into in */
    void *job;
    int job_fd;
    char *out;
    size_t out_len, out_off;
};

struct http_server {
    int listen_fd, stop_fd;
    pthread_t thread;
    struct http_app app;
    struct conn *conns[HTTP_SERVER_MAX_CONNS];
    size_t n_conns;
    unsigned jobs; /* connections WAITING */
    uint64_t next_seq;
    uint64_t accept_paused_until_ms;
};

static uint64_t now_ms(void)
{
    return hp_clock_ns(CLOCK_MONOTONIC) / 1000000u;
}

void http__respond_text(struct http_response *resp, int status, const char *fmt, ...)
{
    char line[600];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(line, sizeof(line) - 1, fmt, ap);
    va_end(ap);
    size_t len = n < 0 ? 0 : HP_MIN((size_t)n, sizeof(line) - 2);
    line[len++] = '\n';
    *resp = (struct http_response){.status = status, .content_type = "text/plain; charset=utf-8"};
    resp->body = malloc(len);
    if (resp->body) {
        memcpy(resp->body, line, len);
        resp->body_len = len;
    }
}

static const char *reason(int status)
{
    switch (status) {
    case 200:
        return "OK";
    case 400:
        return "Bad Request";
    case 404:
        return "Not Found";
    case 405:
        return "Method Not Allowed";
    case 408:
        return "Request Timeout";
    case 431:
        return "Request Header Fields Too Large";
    case 500:
        return "Internal Server Error";
    case 503:
        return "Service Unavailable";
    case 505:
        return "HTTP Version Not Supported";
    default:
        return "Unknown";
    }
}

static void conn_close(struct http_server *srv, struct conn *c)
{
    if (c->fd < 0)
        return;
    if (c->st == CONN_WAITING) {
        srv->app.cancel(srv->app.ctx, c->job);
        srv->jobs--;
    }
    (void)close(c->fd);
    c->fd = -1;
    free(c->in);
    free(c->out);
    c->in = c->out = NULL;
}

/* Sends what is left of the answer; once all is out, half-closes and drains. */
static void conn_write(struct http_server *srv, struct conn *c, uint64_t now)
{
    while (c->out_off < c->out_len) {
        ssize_t w =
            send(c->fd, c->out + c->out_off, c->out_len - c->out_off, MSG_DONTWAIT | MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return;
        if (w <= 0) {
            conn_close(srv, c);
            return;
        }
        c->out_off += (size_t)w;
    }
    free(c->out);
    c->out = NULL;
    (void)shutdown(c->fd, SHUT_WR);
    c->st = CONN_DRAINING;
    c->deadline_ms = now + DRAIN_MS;
}

/* Turns @resp (its body taken) into the bytes to send, and starts sending them. */
static void conn_answer(struct http_server *srv, struct conn *c, struct http_response *resp,
                        uint64_t now)
{
    char head[1024];
    int hn = snprintf(head, sizeof(head),
                      "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n"
                      "Connection: close\r\nCache-Control: no-store\r\n"
                      "X-Content-Type-Options: nosniff\r\n%s\r\n",
                      resp->status, reason(resp->status),
                      resp->content_type ? resp->content_type : "text/plain", resp->body_len,
                      resp->extra_headers ? resp->extra_headers : "");
    size_t hlen = hn < 0 ? 0 : HP_MIN((size_t)hn, sizeof(head) - 1);
    bool body = c->req.method != HTTP_METHOD_HEAD;
    size_t blen = body ? resp->body_len : 0;
    free(c->out);
    c->out = malloc(hlen + blen);
    if (!c->out) {
        free(resp->body);
        conn_close(srv, c);
        return;
    }
    memcpy(c->out, head, hlen);
    if (blen)
        memcpy(c->out + hlen, resp->body, blen);
    free(resp->body);
    resp->body = NULL;
    c->out_len = hlen + blen;
    c->out_off = 0;
    c->st = CONN_WRITING;
    c->deadline_ms = now + HTTP_SERVER_SEND_MS;
    conn_write(srv, c, now);
}

static void answer_text(struct http_server *srv, struct conn *c, uint64_t now, int status,
                        const char *why)
{
    struct http_response resp;
    http__respond_text(&resp, status, "%s", why);
    conn_answer(srv, c, &resp, now);
}

static void conn_read(struct http_server *srv, struct conn *c, uint64_t now)
{
    for (;;) {
        ssize_t n = recv(c->fd, c->in + c->in_len, HTTP_MAX_HEAD - c->in_len, MSG_DONTWAIT);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return;
        if (n <= 0) {
            conn_close(srv, c); /* gone before its request was whole: nobody to answer */
            return;
        }
        c->in_len += (size_t)n;
        int r = http_parse_request(c->in, c->in_len, &c->req);
        if (r < 0) {
            answer_text(srv, c, now, -r, c->req.why_bad);
            return;
        }
        if (r > 0) {
            c->st = CONN_QUEUED;
            c->queued_seq = srv->next_seq++;
            return;
        }
    }
}

static void conn_drain(struct http_server *srv, struct conn *c)
{
    char sink[4096];
    for (;;) {
        ssize_t n = recv(c->fd, sink, sizeof(sink), MSG_DONTWAIT);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return;
        if (n <= 0) {
            conn_close(srv, c);
            return;
        }
    }
}

/* Hands @c's request to the application. */
static void conn_start(struct http_server *srv, struct conn *c, uint64_t now)
{
    struct http_response resp = {0};
    void *job = NULL;
    int fd = -1;
    if (srv->app.start(srv->app.ctx, &c->req, &resp, &job, &fd) == 0) {
        conn_answer(srv, c, &resp, now);
        return;
    }
    c->st = CONN_WAITING;
    c->job = job;
    c->job_fd = fd;
    c->deadline_ms = now + HTTP_SERVER_JOB_MS;
    srv->jobs++;
}

static void conn_step(struct http_server *srv, struct conn *c, uint64_t now)
{
    struct http_response resp = {0};
    int fd = -1;
    if (srv->app.step(srv->app.ctx, c->job, &resp, &fd) == 1) {
        c->job_fd = fd;
        return;
    }
    c->job = NULL;
    srv->jobs--;
    c->st = CONN_WRITING;
    conn_answer(srv, c, &resp, now);
}

static void conn_expire(struct http_server *srv, struct conn *c, uint64_t now)
{
    switch (c->st) {
    case CONN_READING:
        answer_text(srv, c, now, 408, "the request head did not arrive in time");
        break;
    case CONN_WAITING:
        srv->app.cancel(srv->app.ctx, c->job);
        c->job = NULL;
        srv->jobs--;
        c->st = CONN_WRITING;
        answer_text(srv, c, now, 503, "the answer was not ready in time");
        break;
    case CONN_QUEUED:
        break;
    case CONN_WRITING:
    case CONN_DRAINING:
        conn_close(srv, c);
        break;
    }
}

/* Room for one more connection: the oldest one still sending its request (or draining)
 * makes way, so clients that hold connections open without a request cannot lock others
 * out. False when every connection is busy with a request. */
static bool make_room(struct http_server *srv)
{
    struct conn *oldest = NULL;
    for (size_t i = 0; i < srv->n_conns; i++) {
        struct conn *c = srv->conns[i];
        if (c->fd >= 0 && (c->st == CONN_READING || c->st == CONN_DRAINING) &&
            (!oldest || c->accepted_ms < oldest->accepted_ms))
            oldest = c;
    }
    if (!oldest)
        return false;
    conn_close(srv, oldest);
    return true;
}

static void remove_closed(struct http_server *srv)
{
    size_t k = 0;
    for (size_t i = 0; i < srv->n_conns; i++) {
        if (srv->conns[i]->fd >= 0)
            srv->conns[k++] = srv->conns[i];
        else
            free(srv->conns[i]);
    }
    srv->n_conns = k;
}

static void accept_new(struct http_server *srv, uint64_t now)
{
    static const char busy[] = "HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n"
                               "Connection: close\r\nRetry-After: 1\r\n\r\n";
    for (int i = 0; i < 16; i++) {
        int fd = accept4(srv->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM)
                srv->accept_paused_until_ms = now + ACCEPT_PAUSE_MS;
            return;
        }
        if (srv->n_conns == HTTP_SERVER_MAX_CONNS && make_room(srv))
            remove_closed(srv);
        struct conn *c = srv->n_conns < HTTP_SERVER_MAX_CONNS ? calloc(1, sizeof(*c)) : NULL;
        char *in = c ? malloc(HTTP_MAX_HEAD) : NULL;
        if (!in) {
            (void)!send(fd, busy, sizeof(busy) - 1, MSG_DONTWAIT | MSG_NOSIGNAL);
            (void)close(fd);
            free(c);
            continue;
        }
        *c = (struct conn){.fd = fd,
                           .st = CONN_READING,
                           .accepted_ms = now,
                           .deadline_ms = now + HTTP_SERVER_HEAD_MS,
                           .in = in,
                           .job_fd = -1};
        srv->conns[srv->n_conns++] = c;
    }
}

/* Gives free job slots to the connections queued longest. */
static void start_queued(struct http_server *srv, uint64_t now)
{
    while (srv->jobs < HTTP_SERVER_MAX_JOBS) {
        struct conn *first = NULL;
        for (size_t i = 0; i < srv->n_conns; i++) {
            struct conn *c = srv->conns[i];
            if (c->fd >= 0 && c->st == CONN_QUEUED && (!first || c->queued_seq < first->queued_seq))
                first = c;
        }
        if (!first)
            return;
        conn_start(srv, first, now);
    }
}

/* One connection's event. */
static void conn_event(struct http_server *srv, struct conn *c, short revents, uint64_t now)
{
    if (c->fd < 0 || !revents)
        return;
    switch (c->st) {
    case CONN_READING:
        conn_read(srv, c, now);
        break;
    case CONN_WAITING:
        conn_step(srv, c, now);
        break;
    case CONN_WRITING:
        conn_write(srv, c, now);
        break;
    case CONN_DRAINING:
        conn_drain(srv, c);
        break;
    case CONN_QUEUED:
        break;
    }
}

/* The poll set: the stop and listening descriptors, then one per connection (@who says
 * whose); the timeout until the next deadline. */
static size_t build_pollset(struct http_server *srv, struct pollfd *p, struct conn **who,
                            uint64_t now, int *ret_timeout)
{
    size_t n = 0;
    uint64_t next = now + 60000;
    p[n++] = (struct pollfd){.fd = srv->stop_fd, .events = POLLIN};
    bool paused = now < srv->accept_paused_until_ms;
    p[n++] = (struct pollfd){.fd = paused ? -1 : srv->listen_fd, .events = POLLIN};
    if (paused)
        next = HP_MIN(next, srv->accept_paused_until_ms);
    for (size_t i = 0; i < srv->n_conns; i++) {
        struct conn *c = srv->conns[i];
        short ev = c->st == CONN_WRITING ? POLLOUT : POLLIN;
        int fd = c->st == CONN_WAITING ? c->job_fd : c->st == CONN_QUEUED ? -1 : c->fd;
        who[n] = c;
        p[n++] = (struct pollfd){.fd = fd, .events = ev};
        if (c->st != CONN_QUEUED)
            next = HP_MIN(next, c->deadline_ms);
    }
    *ret_timeout = next > now ? (int)(next - now) : 0;
    return n;
}

static void *server_main(void *arg)
{
    struct http_server *srv = arg;
    struct pollfd p[2 + HTTP_SERVER_MAX_CONNS];
    struct conn *who[2 + HTTP_SERVER_MAX_CONNS];
    for (;;) {
        int timeout;
        size_t n = build_pollset(srv, p, who, now_ms(), &timeout);
        if (poll(p, n, timeout) < 0 && errno != EINTR) {
            hp_log_warn("http: poll: %s", strerror(errno));
            break;
        }
        if (p[0].revents)
            break;
        uint64_t now = now_ms();
        for (size_t i = 2; i < n; i++)
            conn_event(srv, who[i], p[i].revents, now);
        for (size_t i = 0; i < srv->n_conns; i++) {
            struct conn *c = srv->conns[i];
            if (c->fd >= 0 && c->st != CONN_QUEUED && now >= c->deadline_ms)
                conn_expire(srv, c, now);
        }
        remove_closed(srv);
        if (p[1].revents)
            accept_new(srv, now);
        start_queued(srv, now);
        remove_closed(srv);
    }
    for (size_t i = 0; i < srv->n_conns; i++)
        conn_close(srv, srv->conns[i]);
    remove_closed(srv);
    return NULL;
}

int http__server_start(int listen_fd, const struct http_app *app, http_server_t **ret)
{
    struct http_server *srv = calloc(1, sizeof(*srv));
    if (!srv) {
        (void)close(listen_fd);
        return -ENOMEM;
    }
    srv->listen_fd = listen_fd;
    srv->app = *app;
    srv->stop_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    int r = srv->stop_fd < 0 ? -errno : 0;
    if (r == 0) {
        int fl = fcntl(listen_fd, F_GETFL);
        if (fl < 0 || fcntl(listen_fd, F_SETFL, fl | O_NONBLOCK) < 0)
            r = -errno;
    }
    if (r == 0)
        r = -pthread_create(&srv->thread, NULL, server_main, srv);
    if (r < 0) {
        if (srv->stop_fd >= 0)
            (void)close(srv->stop_fd);
        (void)close(listen_fd);
        free(srv);
        return r;
    }
    *ret = srv;
    return 0;
}

http_server_t *http__server_stop(http_server_t *srv)
{
    if (!srv)
        return NULL;
    uint64_t one = 1;
    (void)!write(srv->stop_fd, &one, sizeof(one));
    pthread_join(srv->thread, NULL);
    (void)close(srv->stop_fd);
    (void)close(srv->listen_fd);
    free(srv);
    return NULL;
}
