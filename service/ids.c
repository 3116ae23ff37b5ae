/* service/ids.c: what a client says on its socket after the handshake.
 *
 * A profiled process changed its user or group ids: its client's session thread took the
 * new ids and sent them with SCM_CREDENTIALS (preload/ids.c), which the kernel checked
 * against the sending thread: the credentials are the process's at the time of the
 * change, as SO_PEERCRED is a new client's at its connect(). They go through the same
 * policy as a new client's (svc__uid_allowed()): our own uid, any uid as root with
 * --allow-other-users, or any when the service follows every change (heapprof record as
 * root, which started the process). A refusal ends the session and says why, once.
 *
 * A child of fork() the session does not follow says so on its parent's socket
 * (preload/client.c); its credentials name it. At the end of the parent's session, those
 * children that never connected themselves (after an exec) are the ones not followed.
 *
 * The ring's counts tell when to read (ring_ids_changes(), ring_forks_unfollowed()).
 * Unwinder threads. */
#include "service/svc_internal.h"

#include <errno.h>
#include <pwd.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/containers.h"
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

/* Reads one message (wire_ids or wire_forked: the same size) from @sock with its
 * credentials into @ret_msg and @ret_cred. Returns its magic, 0 when none is waiting, or
 * -EPROTO when what came is not one (or carries no credentials). */
static int read_message(int sock, struct wire_ids *ret_msg, struct ucred *ret_cred)
{
    union {
        char buf[CMSG_SPACE(sizeof(struct ucred)) + CMSG_SPACE(4 * sizeof(int))];
        struct cmsghdr align;
    } u;
    struct iovec iov = {.iov_base = ret_msg, .iov_len = sizeof(*ret_msg)};
    struct msghdr mh = {
        .msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf, .msg_controllen = sizeof(u.buf)};
    ssize_t n = recvmsg(sock, &mh, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
    if (n < 0)
        return errno == EAGAIN || errno == EWOULDBLOCK ? 0 : -EPROTO;
    bool have = false;
    for (struct cmsghdr *cm = CMSG_FIRSTHDR(&mh); cm; cm = CMSG_NXTHDR(&mh, cm)) {
        if (cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_RIGHTS) {
            /* Not ours to keep. */
            int *fds = (int *)CMSG_DATA(cm);
            for (size_t i = 0; i < (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int); i++)
                (void)close(fds[i]);
        } else if (cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_CREDENTIALS &&
                   cm->cmsg_len >= CMSG_LEN(sizeof(*ret_cred))) {
            memcpy(ret_cred, CMSG_DATA(cm), sizeof(*ret_cred));
            have = true;
        }
    }
    if (n == 0)
        return 0; /* the peer hung up: nothing more */
    if (n != (ssize_t)sizeof(*ret_msg) || !have || (mh.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) ||
        ret_msg->pid != ret_cred->pid)
        return -EPROTO;
    if (ret_msg->magic == WIRE_IDS_MAGIC &&
        (ret_msg->uid != ret_cred->uid || ret_msg->gid != ret_cred->gid))
        return -EPROTO;
    if (ret_msg->magic != WIRE_IDS_MAGIC && ret_msg->magic != WIRE_FORKED_MAGIC)
        return -EPROTO;
    return (int)ret_msg->magic;
}

#define MAX_FORKED 4096

/* A child of @c's process (kernel-checked pid @pid) that was not followed. */
static void note_forked(struct svc_client *c, pid_t pid)
{
    if (c->n_forked < MAX_FORKED &&
        hp_grow((void **)&c->forked, &c->cap_forked, c->n_forked + 1, sizeof(*c->forked)) == 0)
        c->forked[c->n_forked++] = pid;
    else
        c->forked_unlisted++;
}

const char *svc__fork_hint(const struct svc_config *cfg)
{
    return cfg->fork_hint ? cfg->fork_hint : "use --follow-fork";
}

uint64_t svc__forks_unfollowed(struct svc *s, const struct svc_client *c)
{
    uint64_t n = c->forked_unlisted;
    for (size_t i = 0; i < c->n_forked; i++)
        n += !svc_client_seen(s, c->forked[i]);
    return n;
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

/* Logs the check of @c's new ids @cred; returns whether they are allowed. */
static bool ids_allowed(const struct svc *s, const struct svc_client *c, const struct ucred *cred)
{
    char who[160], why[512];
    const char *name = svc__client_name(c);
    user_name(cred->uid, who, sizeof(who));
    if (!svc__uid_allowed(cred->uid, s->cfg.allow_other_users, s->cfg.follow_any_ids)) {
        hp_log_warn("pid %d (%s) changed its user to %s: not profiled from there on: %s",
                    (int)c->pid, name, who, refusal(cred->uid, why, sizeof(why)));
        return false;
    }
    if (s->cfg.log_processes)
        hp_log_note("pid %d (%s): changed its user to %s (group %u); still profiled", (int)c->pid,
                    name, who, (unsigned)cred->gid);
    else
        hp_log_info("pid %d: changed its user to uid %u; still profiled", (int)c->pid,
                    (unsigned)cred->uid);
    return true;
}

bool svc__client_messages(const struct svc *s, struct svc_client *c, const char **ret_why)
{
    /* Each count moves after its message was sent: what they say is waiting. */
    uint32_t ids = ring_ids_changes(c->ring);
    c->forks_seen = ring_forks_unfollowed(c->ring);
    bool ending = c->ending, ids_read = false;
    struct wire_ids msg;
    struct ucred cred;
    int r;
    while ((r = read_message(c->sock, &msg, &cred)) > 0) {
        if (r == (int)WIRE_FORKED_MAGIC) {
            note_forked(c, cred.pid);
            continue;
        }
        if (cred.pid != c->pid || ending)
            continue; /* a child's, which has no say; or too late to matter */
        ids_read = true;
        if (!ids_allowed(s, c, &cred)) {
            *ret_why = "(it changed to a user this service does not profile)";
            return false;
        }
    }
    if (ending || ids == c->ids_seen)
        return true;
    if (!ids_read) {
        hp_log_warn("pid %d (%s) changed its user or group ids but its client sent no valid "
                    "credentials: not profiled from there on",
                    (int)c->pid, svc__client_name(c));
        *ret_why = "(it changed its user or group ids)";
        return false;
    }
    c->ids_seen = ids;
    return true;
}
