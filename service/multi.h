/* service/multi.h: several profiling sessions behind the daemon's one socket
 * (service/multi.c).
 *
 * heapprofd --producer runs one session per data source instance of Perfetto's tracing
 * service, at the same time, behind its one socket: each connection goes to one session
 * (the one that signalled the process, else the oldest whose targets match); the other
 * matching sessions record the process as rejected_concurrent, as Perfetto's heapprofd.
 *
 *     svc_multi_t *m;
 *     svc_multi_new(path, &m);
 *     svc_multi_start(m, id, &cfg, &sink);         // signals running targets
 *     loop: poll(svc_multi_pollfds(), svc_multi_timeout_ms()); svc_multi_dispatch(m);
 *     svc_multi_stop(m, id, done, ctx);           // final dumps on a thread, then done()
 *
 * Main thread only (done() runs on the session's stop thread). */
#ifndef HP_SERVICE_MULTI_H
#define HP_SERVICE_MULTI_H

#include <poll.h>
#include <stddef.h>
#include <stdint.h>

#include "common/macros.h"
#include "service/config.h"

struct bk_sink;

typedef struct svc_multi svc_multi_t;

/* Listens on @socket_path. Returns 0, -EADDRINUSE (a live service answers there), -errno. */
int svc_multi_new(const char *socket_path, svc_multi_t **ret) HP_WARN_UNUSED;
/* Starts session @id with @cfg (checked; its process_cmdline strings are taken, @cfg
 * keeps none) writing to @sink (copied; its context must live until done()). Unless
 * no_running, signals the running targets that have the library. */
int svc_multi_start(svc_multi_t *m, uint64_t id, struct svc_config *cfg,
                    const struct bk_sink *sink) HP_WARN_UNUSED;
/* Ends session @id on a thread of its own: its clients are drained and detached, their
 * final dumps written, its threads joined; then @done(@ctx, @id) runs on that thread
 * (no packet of the session is written after it). Returns 0 or -ENOENT. */
int svc_multi_stop(svc_multi_t *m, uint64_t id, void (*done)(void *ctx, uint64_t id), void *ctx);
/* The descriptors to poll (the daemon socket, each session's): returns their count. */
size_t svc_multi_pollfds(svc_multi_t *m, struct pollfd *fds, size_t max);
/* Milliseconds until the next continuous dump or check, or -1. */
int svc_multi_timeout_ms(svc_multi_t *m);
/* Accepts and routes connections, serves handshakes, continuous dumps, guardrails, and
 * forgets the sessions that have ended. Never blocks for long. */
void svc_multi_dispatch(svc_multi_t *m);
/* Dumps every live session now (SIGUSR1). */
void svc_multi_dump_now(svc_multi_t *m);
/* Sessions started and not yet forgotten (those ending included). */
size_t svc_multi_sessions(const svc_multi_t *m);
/* Ends the sessions still live (without callbacks), waits for every stop thread, removes
 * the socket. Accepts NULL. */
svc_multi_t *svc_multi_free(svc_multi_t *m);

#endif
