/* common/fdpass.h: send and receive a small fixed-size message with file descriptors
 * over a UNIX stream socket (SCM_RIGHTS). Hook-safe: raw sendmsg/recvmsg (common/sys.h:
 * no errno, no thread state, so also from the client's session thread), no allocation.
 *
 *     int fds[2] = {maps_fd, mem_fd};
 *     int r = hp_send_fds(sock, &hello, sizeof(hello), fds, 2);
 *     r = hp_recv_fds(sock, &cfg, sizeof(cfg), fds, 1, &nfds);
 */
#ifndef HP_COMMON_FDPASS_H
#define HP_COMMON_FDPASS_H

#include <stddef.h>

#include "common/macros.h"

#define HP_MAX_PASSED_FDS 4

/* Sends exactly @len bytes of @buf with @nfds descriptors attached to the first byte.
 * Returns 0 or -errno (-EPIPE when the peer is gone). Never raises SIGPIPE. */
int hp_send_fds(int sock, const void *buf, size_t len, const int *fds, size_t nfds) HP_WARN_UNUSED;

/* Receives exactly @len bytes into @buf and up to @max_fds descriptors (close-on-exec).
 * Descriptors beyond @max_fds, or attached to a short message, are closed. Writes the
 * received count to @ret_nfds. Returns 0, -ECONNRESET on EOF, -EBADMSG on a short or
 * truncated message, or -errno. */
int hp_recv_fds(int sock, void *buf, size_t len, int *fds, size_t max_fds,
                size_t *ret_nfds) HP_WARN_UNUSED;

#endif
