/* service/control.c: control requests on the service's socket (`heapprof dump`), both
 * ends. A request is a struct wire_control where a client would send its hello; the
 * service answers and closes. Asking over the socket, instead of signalling a pid kept in
 * a file, proves that what answers is a heapprof service, alive, of our user. */
#include "service/svc_internal.h"

#include <errno.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include "common/log.h"
#include "common/macros.h"
#include "shmem_ring/wire.h"

/* How long a control request waits for the daemon: generous, as a loaded machine (or a
 * sanitizer build) can keep its main thread from the socket for seconds. */
#define CONTROL_TIMEOUT_MS 10000

static void set_timeouts(int fd)
{
    struct timeval tv = {.tv_sec = CONTROL_TIMEOUT_MS / 1000,
                         .tv_usec = (CONTROL_TIMEOUT_MS % 1000) * 1000};
    (void)setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    (void)setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
}

/* True when the peer of @fd runs as our user or as root; its pid in @ret_pid. */
static bool peer_trusted(int fd, pid_t *ret_pid)
{
    struct ucred cred;
    socklen_t len = sizeof(cred);
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) < 0 || len != sizeof(cred))
        return false;
    *ret_pid = cred.pid;
    return cred.uid == geteuid() || cred.uid == 0;
}

bool svc__is_control(int fd)
{
    struct wire_control req;
    ssize_t n = recv(fd, &req, sizeof(req), MSG_PEEK | MSG_DONTWAIT);
    return n == (ssize_t)sizeof(req) && req.magic == WIRE_CONTROL_MAGIC;
}

static int dump_session(void *ctx)
{
    return svc_dump_now(ctx);
}

void svc__control(struct svc *s, int fd)
{
    svc__control_answer(fd, dump_session, s);
}

void svc__control_answer(int fd, int (*dump)(void *ctx), void *ctx)
{
    struct wire_control req, ans = {.magic = WIRE_CONTROL_MAGIC, .pid = (int32_t)getpid()};
    set_timeouts(fd);
    if (recv(fd, &req, sizeof(req), MSG_WAITALL) != (ssize_t)sizeof(req)) {
        (void)close(fd);
        return;
    }
    ans.op = req.op;
    pid_t peer;
    if (!peer_trusted(fd, &peer)) {
        ans.status = -EACCES;
        hp_log_warn("control request from another user refused");
    } else if (req.op == WIRE_CONTROL_DUMP) {
        ans.status = dump(ctx);
        hp_log_info("dump requested (pid %d)", (int)req.pid);
    } else if (req.op == WIRE_CONTROL_PING) {
        ans.status = 0;
    } else {
        ans.status = -EOPNOTSUPP;
    }
    (void)!send(fd, &ans, sizeof(ans), MSG_NOSIGNAL);
    (void)close(fd);
}

int svc_control_dump(const char *socket_path, pid_t want, pid_t *ret_pid)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    if (strlen(socket_path) >= sizeof(sa.sun_path))
        return -ENAMETOOLONG;
    strcpy(sa.sun_path, socket_path);
    HP_CLEANUP_CLOSE int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -errno;
    set_timeouts(fd);
    if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0)
        return -errno;
    pid_t peer = 0;
    if (!peer_trusted(fd, &peer))
        return -EACCES;
    /* Not the process asked for: ask for nothing (a ping, so that the service does not
     * log a connection that sent nothing). */
    bool other = want && peer != want;
    struct wire_control req = {.magic = WIRE_CONTROL_MAGIC,
                               .op = other ? WIRE_CONTROL_PING : WIRE_CONTROL_DUMP,
                               .pid = (int32_t)getpid()};
    if (send(fd, &req, sizeof(req), MSG_NOSIGNAL) != (ssize_t)sizeof(req))
        return -errno;
    struct wire_control ans;
    ssize_t n = recv(fd, &ans, sizeof(ans), MSG_WAITALL);
    if (n < 0)
        return errno == EAGAIN ? -ETIMEDOUT : -errno;
    if (n != (ssize_t)sizeof(ans) || ans.magic != WIRE_CONTROL_MAGIC || ans.op != req.op ||
        ans.pid <= 0)
        return -EPROTO;
    if (other) {
        *ret_pid = peer;
        return -ESRCH;
    }
    if (ans.status < 0)
        return ans.status;
    *ret_pid = (pid_t)ans.pid;
    return 0;
}
