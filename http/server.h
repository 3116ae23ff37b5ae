/* http/server.h: a small HTTP/1.x server on a thread of its own, for an application
 * that answers each request at once or after waiting for a descriptor (internal to
 * http/; http/app.c is the application of heapprofd).
 *
 * One thread, one poll() over every connection: nothing it does blocks, so a client that
 * sends slowly, sends nothing or never reads holds only its own connection, until its
 * deadline. Limits: HTTP_SERVER_MAX_CONNS connections (a new one beyond takes the place
 * of the oldest still sending its request, else is answered 503), the request head in
 * HTTP_SERVER_HEAD_MS, the answer sent in HTTP_SERVER_SEND_MS, HTTP_SERVER_MAX_JOBS
 * requests in the application's hands at a time (others wait their turn). One request
 * per connection, answered with Connection: close.
 *
 *     struct http_app app = {.start = my_start, .step = my_step, .cancel = my_cancel};
 *     http__server_start(listen_fd, &app, &srv);
 *     ...
 *     srv = http__server_stop(srv);
 */
#ifndef HP_HTTP_SERVER_H
#define HP_HTTP_SERVER_H

#include <stddef.h>

#include "common/macros.h"
#include "http/request.h"

#define HTTP_SERVER_MAX_CONNS 64
#define HTTP_SERVER_MAX_JOBS 4
#define HTTP_SERVER_HEAD_MS 10000
#define HTTP_SERVER_JOB_MS 30000
#define HTTP_SERVER_SEND_MS 30000

/* An answer. */
struct http_response {
    int status;
    const char *content_type;  /* static */
    const char *extra_headers; /* static, each line ending in "\r\n"; or NULL */
    char *body;                /* malloc'd: taken by the server */
    size_t body_len;
};

/* Fills @resp with @status and a one-line text body "@fmt...\n". */
void http__respond_text(struct http_response *resp, int status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* The application. Called on the server's thread only. */
struct http_app {
    /* Answers @req (borrowed for the call): fills @resp and returns 0; or starts a job
     * and returns 1 with its state in *@ret_job and a descriptor in *@ret_fd that is
     * readable when step() should be called. */
    int (*start)(void *ctx, const struct http_request *req, struct http_response *resp,
                 void **ret_job, int *ret_fd);
    /* Goes on with @job: returns 0 with @resp filled (the job is over: the application
     * freed it), or 1 to be called again when *@ret_fd is readable. */
    int (*step)(void *ctx, void *job, struct http_response *resp, int *ret_fd);
    /* The client went away or its time ran out: frees @job. */
    void (*cancel)(void *ctx, void *job);
    void *ctx;
};

typedef struct http_server http_server_t;

/* Serves @listen_fd (taken; made non-blocking) with @app (copied) on a new thread.
 * Returns 0 or -errno. */
int http__server_start(int listen_fd, const struct http_app *app,
                       http_server_t **ret) HP_WARN_UNUSED;
/* Stops the thread, closes every connection (jobs cancelled) and frees. Accepts NULL. */
http_server_t *http__server_stop(http_server_t *srv);

#endif
