/* common/paths.h: where the service's sockets live, computed the same way by the
 * service and by the preload client. Hook-safe (no allocation, no libc locale or stdio).
 *
 * The runtime directory is "$XDG_RUNTIME_DIR/heapprof" when XDG_RUNTIME_DIR is an
 * absolute path, else "/tmp/heapprof-<uid>". Both sides require it to be a directory
 * owned by the uid with mode 0700. In it:
 *   heapprofd.sock       the daemon's socket
 *   attach-<pid>.sock    the socket of a `heapprof attach` session run by process <pid>;
 *                        the wake call passes <pid> to the client (common/wake.h), which
 *                        answers there only process <pid> itself (preload/peer.h)
 *
 * A session of `heapprof attach --allow-other-users` (root) listens instead on the
 * abstract socket "@heapprof-attach-<pid>" (hp_attach_abstract_name()): a target of
 * another user cannot reach root's runtime directory, and an abstract socket has no
 * file; every connection is checked at the handshake, and the client answers there only
 * process <pid> (as root). The client tries it when the path is not there for it.
 *
 *     char dir[HP_PATH_MAX];
 *     hp_runtime_dir(getenv("XDG_RUNTIME_DIR"), getuid(), dir, sizeof(dir));
 */
#ifndef HP_COMMON_PATHS_H
#define HP_COMMON_PATHS_H

#include <stddef.h>
#include <sys/types.h>

#include "common/macros.h"

#define HP_PATH_MAX 108 /* sizeof(sockaddr_un.sun_path) */
#define HP_DAEMON_SOCKET_NAME "heapprofd.sock"

/* Writes the runtime directory. Returns 0, or -ENAMETOOLONG. */
int hp_runtime_dir(const char *xdg_runtime_dir, uid_t uid, char *buf, size_t len) HP_WARN_UNUSED;
/* Writes "<dir>/heapprofd.sock" (@attach_pid <= 0) or "<dir>/attach-<pid>.sock". */
int hp_socket_path(const char *xdg_runtime_dir, uid_t uid, pid_t attach_pid, char *buf,
                   size_t len) HP_WARN_UNUSED;

/* A socket "path" starting with this names an abstract socket (the name after it). */
#define HP_ABSTRACT_PREFIX '@'
/* Writes "@heapprof-attach-<pid>". */
int hp_attach_abstract_name(pid_t attach_pid, char *buf, size_t len) HP_WARN_UNUSED;

/* Service side only (common/rundir.c; not hook-safe). */

/* Creates the runtime directory if needed and checks it: a directory (not a symlink)
 * owned by us with mode 0700. Writes its path to @buf. Returns 0 or -errno with a
 * message in @err. */
int hp_runtime_dir_prepare(char *buf, size_t len, char *err, size_t err_len) HP_WARN_UNUSED;
/* The directory of the socket of a daemon that other users' processes may connect to
 * (--allow-other-users): root's, writable by nobody else, searchable by everyone. */
#define HP_SHARED_SOCKET_DIR "/run/heapprof"
/* Creates HP_SHARED_SOCKET_DIR if needed and checks it: a directory (not a symlink) owned
 * by us (root) and not writable by group or others; makes it mode 0755 when it was
 * tighter (others must reach the socket in it). Writes its path to @buf. Returns 0 or
 * -errno with a message in @err. */
int hp_shared_dir_prepare(char *buf, size_t len, char *err, size_t err_len) HP_WARN_UNUSED;
/* Creates a new private directory (mode 0700) "heapprof-XXXXXX" under $XDG_RUNTIME_DIR
 * when that is a usable directory, else under /tmp, for the socket of one session.
 * Writes its path to @buf. Returns 0 or -errno. */
int hp_private_dir_new(char *buf, size_t len) HP_WARN_UNUSED;

#endif
