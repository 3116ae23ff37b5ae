/* preload/ids.c: the session thread follows the process's user and group ids.
 *
 * A server started as root drops to its own user (nginx's workers to www-data, apache,
 * postgres' helpers) with setuid() and friends. glibc changes the ids of every thread it
 * knows (its setxid broadcast); the session thread (preload/attach.c) is not one of
 * them, so after the drop it would be the one thread of the process still running as
 * root: a privilege the program meant to give up. Every round the thread compares its
 * own ids with the process's (/proc/self/status, the main thread's: the file is
 * readable by the process whatever its ids and whether it is dumpable) and, when they
 * differ, takes the process's ids itself (setgroups, setresgid, setresuid on this thread
 * only: raw system calls change the calling thread's credentials).
 *
 * The service then decides, as for a new client: the thread sends a wire_ids message
 * with SCM_CREDENTIALS on the session's socket (the kernel checks the credentials
 * against the thread's ids, which are now the process's), then bumps the ring's count;
 * the service reads the message when the count moves and ends the session if its
 * policy refuses the new uid (service/ids.c). Nothing the session needs is reopened by
 * path after the change: the ring and the unwind table are memfds mapped already, the
 * socket is connected, and the /proc/self/maps and mem descriptors the service holds
 * were opened (and access-checked) at the handshake.
 *
 * When the thread cannot take the new ids (a program that holds capabilities our thread
 * lacks, more groups than we can read), the session ends as before the thread could
 * follow: RING_END_CREDENTIALS, which the service reports.
 */
#include "preload/client.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <time.h>

#include "common/sys.h"
#include "shmem_ring/wire.h"

#define IDS_MAX_GROUPS 64
/* How long a change of ids is left to complete before it is taken. */
#define IDS_SETTLE_MS 20

struct client_ids {
    uint32_t uid[3], gid[3]; /* real, effective, saved */
    uint32_t groups[IDS_MAX_GROUPS];
    unsigned n_groups;
};

/* Parses up to @max decimal numbers after the "\n@key" line of @buf into @out; returns
 * how many, or -1 when the line is missing, cut short or holds more than @max. */
static int ids_parse_line(const char *buf, size_t len, const char *key, uint32_t *out, unsigned max)
{
    size_t klen = strlen(key);
    const char *p = NULL;
    for (size_t i = 0; i + klen < len; i++)
        if (buf[i] == '\n' && !memcmp(buf + i + 1, key, klen)) {
            p = buf + i + 1 + klen;
            break;
        }
    if (!p)
        return -1;
    const char *end = buf + len;
    unsigned n = 0;
    for (;;) {
        while (p < end && (*p == ' ' || *p == '\t'))
            p++;
        if (p >= end)
            return -1; /* no end of line: cut short */
        if (*p == '\n')
            return (int)n;
        if (*p < '0' || *p > '9' || n == max)
            return -1;
        uint64_t v = 0;
        while (p < end && *p >= '0' && *p <= '9' && v <= UINT32_MAX)
            v = v * 10 + (uint64_t)(*p++ - '0');
        if (v > UINT32_MAX)
            return -1;
        out[n++] = (uint32_t)v;
    }
}

/* The process's ids: its main thread's, from /proc/self/status. */
static bool ids_of_process(struct client_ids *ret)
{
    char buf[4096];
    long fd = hp_sys4(SYS_openat, AT_FDCWD, (long)"/proc/self/status", O_RDONLY | O_CLOEXEC, 0);
    if (fd < 0)
        return false;
    size_t len = 0;
    for (;;) {
        long n = hp_sys3(SYS_read, fd, (long)(buf + len), (long)(sizeof(buf) - 1 - len));
        if (n <= 0)
            break;
        len += (size_t)n;
        if (len == sizeof(buf) - 1)
            break;
    }
    (void)hp_sys_close((int)fd);
    uint32_t u[4], g[4];
    int nu = ids_parse_line(buf, len, "Uid:", u, 4);
    int ng = ids_parse_line(buf, len, "Gid:", g, 4);
    int ngr = ids_parse_line(buf, len, "Groups:", ret->groups, IDS_MAX_GROUPS);
    if (nu < 3 || ng < 3 || ngr < 0)
        return false;
    memcpy(ret->uid, u, sizeof(ret->uid));
    memcpy(ret->gid, g, sizeof(ret->gid));
    ret->n_groups = (unsigned)ngr;
    return true;
}

/* This thread's ids. */
static bool ids_of_thread(struct client_ids *ret)
{
    long n = hp_sys2(SYS_getgroups, IDS_MAX_GROUPS, (long)ret->groups);
    if (n < 0 ||
        hp_sys3(SYS_getresuid, (long)&ret->uid[0], (long)&ret->uid[1], (long)&ret->uid[2]) < 0 ||
        hp_sys3(SYS_getresgid, (long)&ret->gid[0], (long)&ret->gid[1], (long)&ret->gid[2]) < 0)
        return false;
    ret->n_groups = (unsigned)n;
    return true;
}

static bool ids_equal(const struct client_ids *a, const struct client_ids *b)
{
    /* The kernel keeps supplementary groups sorted: equal sets read the same. */
    return !memcmp(a->uid, b->uid, sizeof(a->uid)) && !memcmp(a->gid, b->gid, sizeof(a->gid)) &&
           a->n_groups == b->n_groups &&
           !memcmp(a->groups, b->groups, a->n_groups * sizeof(a->groups[0]));
}

static long ids_set_groups(const struct client_ids *p)
{
    long r = hp_sys2(SYS_setgroups, p->n_groups, (long)p->groups);
    return r < 0 ? r : hp_sys3(SYS_setresgid, p->gid[0], p->gid[1], p->gid[2]);
}

/* Takes @p's ids on this thread. Groups first while our uid may still change them; a
 * change back up (an effective uid of 0 regained from the saved one) needs the uid
 * first. */
static long ids_take(const struct client_ids *p)
{
    long r = ids_set_groups(p);
    if (r == 0)
        return hp_sys3(SYS_setresuid, p->uid[0], p->uid[1], p->uid[2]);
    r = hp_sys3(SYS_setresuid, p->uid[0], p->uid[1], p->uid[2]);
    return r < 0 ? r : ids_set_groups(p);
}

/* Tells the service the new ids on @s's socket: struct wire_ids with SCM_CREDENTIALS. */
static long ids_tell(const struct client_session *s, const struct client_ids *p)
{
    int pid = (int)hp_sys0(SYS_getpid);
    struct wire_ids msg = {.magic = WIRE_IDS_MAGIC, .pid = pid, .uid = p->uid[1], .gid = p->gid[1]};
    struct ucred cred = {.pid = pid, .uid = p->uid[1], .gid = p->gid[1]};
    union {
        char buf[CMSG_SPACE(sizeof(struct ucred))];
        struct cmsghdr align;
    } u;
    memset(&u, 0, sizeof(u));
    struct iovec iov = {.iov_base = &msg, .iov_len = sizeof(msg)};
    struct msghdr mh = {
        .msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf, .msg_controllen = sizeof(u.buf)};
    struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);
    cm->cmsg_level = SOL_SOCKET;
    cm->cmsg_type = SCM_CREDENTIALS;
    cm->cmsg_len = CMSG_LEN(sizeof(cred));
    memcpy(CMSG_DATA(cm), &cred, sizeof(cred));
    long n = hp_sys3(SYS_sendmsg, s->sock, (long)&mh, MSG_NOSIGNAL | MSG_DONTWAIT);
    return n == (long)sizeof(msg) ? 0 : n < 0 ? n : -EIO;
}

int client__ids_follow(struct client_session *s)
{
    struct client_ids proc, self;
    if (!ids_of_process(&proc) || !ids_of_thread(&self))
        return 0; /* unreadable now: looked at again next round */
    if (ids_equal(&proc, &self))
        return 0;
    /* A program changes groups, gid and uid in several calls: let it finish, so that
     * the service hears of the user it becomes rather than of a step on the way. */
    struct timespec ts = {0, IDS_SETTLE_MS * 1000000L};
    (void)hp_sys2(SYS_nanosleep, (long)&ts, 0);
    if (!ids_of_process(&proc))
        return 0;
    long r = ids_take(&proc);
    if (r == 0)
        r = ids_tell(s, &proc);
    if (r < 0)
        return (int)r;
    ring_note_ids_changed(s->ring);
    return 1;
}
