/* http/http.h: heapprofd's HTTP endpoint (`heapprofd --http ADDR:PORT`): the profile of
 * each process the daemon profiles, as it stands at the request, in pprof's format, for
 * `go tool pprof` and for scrapers (Parca, Grafana Alloy's pyroscope.scrape):
 *
 *     /debug/pprof/heap?pid=N     gzipped pprof, default sample type inuse_space
 *     /debug/pprof/allocs?pid=N   the same values, default sample type alloc_space
 *     ...?name=NAME               the one process NAME matches as -n does (comm, argv[0],
 *                                 its basename or the title; globs)
 *     /                           the processes profiled, linked to their profiles
 *     /debug/pprof/               the index of the profiles, as Go's
 *
 * Every profile is taken by the bookkeeping thread on request (svc_query()), which stays
 * the only owner of the profile state; the server runs on a thread of its own and no
 * client can stall it or the service (http/server.h says how).
 *
 *     int fd;
 *     char url[128], err[256];
 *     if (http_listen("127.0.0.1:6060", false, &fd, url, sizeof(url), err, sizeof(err)) < 0)
 *         die(err);
 *     http_endpoint_t *h;
 *     http_endpoint_start(fd, svc, &h);   // before svc_finish(): h = http_endpoint_stop(h);
 */
#ifndef HP_HTTP_HTTP_H
#define HP_HTTP_HTTP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/macros.h"
#include "service/svc.h"

typedef struct http_endpoint http_endpoint_t;

/* Splits a listen address: "ADDR:PORT", "[IPV6]:PORT", ":PORT" or "PORT" (ADDR "" then,
 * meaning loopback). PORT is a decimal in 0..65535 (0: any free port). Returns 0, or
 * -EINVAL with the reason in @err. */
int http_parse_listen(const char *spec, char *host, size_t host_len, uint16_t *ret_port, char *err,
                      size_t err_len) HP_WARN_UNUSED;

/* Listens on @spec (http_parse_listen(); a host name is resolved). An address that is
 * not loopback is refused unless @allow_remote: the profiles (names of functions, files,
 * command lines) would be served to anyone who can connect. Returns the listening
 * descriptor's 0 with it in *@ret_fd and the base URL ("http://127.0.0.1:6060/") in
 * @url, or -errno with a one-line reason in @err. */
int http_listen(const char *spec, bool allow_remote, int *ret_fd, char *url, size_t url_len,
                char *err, size_t err_len) HP_WARN_UNUSED;

/* Serves @listen_fd (taken) for service @s on a thread of its own. Stop it before
 * svc_finish(): queries asked after the bookkeeping thread ended are never answered.
 * Returns 0 or -errno. */
int http_endpoint_start(int listen_fd, svc_t *s, http_endpoint_t **ret) HP_WARN_UNUSED;
/* Stops serving and frees; accepts NULL. */
http_endpoint_t *http_endpoint_stop(http_endpoint_t *h);

#endif
