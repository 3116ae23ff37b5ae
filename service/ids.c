/* service/ids.c: a profiled process changed its user or group ids.
 *
 * Its client's session thread took the new ids and sent them on the session's socket
 * with SCM_CREDENTIALS (preload/ids.c), which the kernel checked against the sending
 * thread: the credentials are the process's at the time of the change, as SO_PEERCRED
 * is a new client's at its connect(). They go through the same policy as a new client's
 * (svc__uid_allowed()): our own uid, any uid as root with --allow-other-users, or any
 * when the service follows every change (heapprof record as root, which started the
 * process). A refusal ends the session and says why, once. Unwinder threads. */
#include "service/svc_internal.h"

#include <errno.h>
#include <pwd.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/log.h"
#include "shmem_ring/wire.h"

bool svc__uid_allowed(uid_t uid, bool allow_other_users, bool follow_any)
{
    uid_t me = geteuid();
    return uid == me || (me == 0 && allow_other_users) || follow_any;
}

/* "www-data (uid 33)" for @uid in @buf. */
static const char *user_name(uid_t uid, char *buf, size_t len)
{
    struct passwd pw, *res = NULL;
    char tmp[1024];
    if (getpwuid_r(uid, &pw, tmp, sizeof(tmp), &res) == 0 && res)
        snprintf(buf, len, "%s (uid %u)", res->pw_name, (unsigned)uid);
    else
        snprintf(buf, len, "uid %u", (unsigned)uid);
    return buf;
}

/* Reads one wire_ids message from @sock with its credentials. Returns 0, -EAGAIN when
 * none is waiting, or -EPROTO when what came is not one (or carries no credentials). */
static int read_ids(int sock, struct ucred *ret)
{
    struct wire_ids msg;
    union {
        char buf[CMSG_SPACE(sizeof(struct ucred)) + CMSG_SPACE(4 * sizeof(int))];
        struct cmsghdr align;
    } u;
    struct iovec iov = {.iov_base = &msg, .iov_len = sizeof(msg)};
    struct msghdr mh = {
        .msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf, .msg_controllen = sizeof(u.buf)};
    ssize_t n = recvmsg(sock, &mh, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
    if (n < 0)
        return errno == EAGAIN || errno == EWOULDBLOCK ? -EAGAIN : -EPROTO;
    bool have = false;
    for (struct cmsghdr *cm = CMSG_FIRSTHDR(&mh); cm; cm = CMSG_NXTHDR(&mh, cm)) {
        if (cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_RIGHTS) {
            /* Not ours to keep. */
            int *fds = (int *)CMSG_DATA(cm);
            for (size_t i = 0; i < (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int); i++)
                (void)close(fds[i]);
        } else if (cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_CREDENTIALS &&
                   cm->cmsg_len >= CMSG_LEN(sizeof(*ret))) {
            memcpy(ret, CMSG_DATA(cm), sizeof(*ret));
            have = true;
        }
    }
    if (n != (ssize_t)sizeof(msg) || msg.magic != WIRE_IDS_MAGIC || !have ||
        (mh.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) || msg.pid != ret->pid || msg.uid != ret->uid ||
        msg.gid != ret->gid)
        return -EPROTO;
    return 0;
}

/* Why a service of ours may not profile @uid, for the log line. */
static const char *refusal(uid_t uid, char *buf, size_t len)
{
    char us[160], them[160];
    uid_t me = geteuid();
    if (me == 0)
        snprintf(buf, len,
                 "this service runs as root without --allow-other-users, and profiles only "
                 "root's processes (start it with --allow-other-users to keep profiling "
                 "processes that drop their privileges)");
    else
        snprintf(buf, len,
                 "this service runs as %s and profiles only that user's processes, not %s's "
                 "(only root may profile another user's processes, with "
                 "--allow-other-users)",
                 user_name(me, us, sizeof(us)), user_name(uid, them, sizeof(them)));
    return buf;
}

bool svc__ids_check(const struct svc *s, struct svc_client *c, const char **ret_why)
{
    uint32_t count = ring_ids_changes(c->ring);
    const char *name = svc__client_name(c);
    char who[160], why[512];
    struct ucred cred = {0};
    bool any = false;
    int r;
    /* One message per change; the last one holds the ids now. */
    while ((r = read_ids(c->sock, &cred)) == 0) {
        any = true;
        if (cred.pid != c->pid)
            break;
        if (!svc__uid_allowed(cred.uid, s->cfg.allow_other_users, s->cfg.follow_any_ids)) {
            hp_log_warn("pid %d (%s) changed its user to %s: not profiled from there on: %s",
                        (int)c->pid, name, user_name(cred.uid, who, sizeof(who)),
                        refusal(cred.uid, why, sizeof(why)));
            *ret_why = "(it changed to a user this service does not profile)";
            return false;
        }
    }
    if (!any || (r != -EAGAIN) || cred.pid != c->pid) {
        hp_log_warn("pid %d (%s) changed its user or group ids but its client sent no valid "
                    "credentials: not profiled from there on",
                    (int)c->pid, name);
        *ret_why = "(it changed its user or group ids)";
        return false;
    }
    c->ids_seen = count;
    if (s->cfg.log_processes)
        hp_log_note("pid %d (%s): changed its user to %s (group %u); still profiled", (int)c->pid,
                    name, user_name(cred.uid, who, sizeof(who)), (unsigned)cred.gid);
    else
        hp_log_info("pid %d: changed its user to uid %u; still profiled", (int)c->pid,
                    (unsigned)cred.uid);
    return true;
}
