/* service/targets.c: finding the processes an attach session or the daemon profiles.
 *
 * A process is attachable when its client advertises its wake entry (a memfd page named
 * "heapprof-attach-wake" in its maps, common/wake.h); service/wake.c wakes it with a
 * remote call, after checking through a pidfd that the pid still names the process
 * inspected (same start time), so that a pid reused meanwhile is never touched. */
#include "service/targets.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/macros.h"
#include "common/paths.h"
#include "common/wake.h"
#include "service/inject.h"
#include "service/svc.h"

int svc__read_small(const char *path, char *buf, size_t len, size_t *ret_n)
{
    HP_CLEANUP_CLOSE int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    size_t n = 0;
    while (n < len) {
        ssize_t k = read(fd, buf + n, len - n);
        if (k < 0 && errno == EINTR)
            continue;
        if (k < 0)
            return -errno;
        if (k == 0)
            break;
        n += (size_t)k;
    }
    *ret_n = n;
    return 0;
}

const char *svc_proc_comm(pid_t pid, char *buf, size_t len)
{
    char path[64];
    size_t n = 0;
    snprintf(path, sizeof(path), "/proc/%d/comm", (int)pid);
    if (len == 0 || svc__read_small(path, buf, len - 1, &n) < 0)
        return NULL;
    buf[n] = '\0';
    buf[strcspn(buf, "\n")] = '\0';
    return buf;
}

/* @p's name, prog and comm, from its command line (@cmd, @n bytes) and comm. */
static void proc_names(struct svc_proc *p, const char *cmd, size_t n)
{
    (void)svc_proc_comm(p->pid, p->comm, sizeof(p->comm));
    char title[512]; /* argv[0] may be a long path before a short name */
    size_t a0 = strnlen(cmd, n);
    if (n == 0 || a0 == 0 || svc_cmdline_title(cmd, n, title, sizeof(title)) == 0) {
        snprintf(p->name, sizeof(p->name), "%s", p->comm); /* a kernel thread, a zombie */
        snprintf(p->prog, sizeof(p->prog), "%s", p->comm);
        return;
    }
    /* A title (spaces in argv[0]: "nginx: master process ...") is shown whole; a path
     * as its basename, the arguments after it. */
    bool retitled = memchr(cmd, ' ', a0) != NULL;
    const char *slash = retitled ? NULL : memrchr(cmd, '/', a0);
    const char *shown = slash ? title + (slash + 1 - cmd) : title;
    size_t len = strlen(shown);
    if (len >= sizeof(p->name))
        snprintf(p->name, sizeof(p->name), "%.*s...", (int)sizeof(p->name) - 4, shown);
    else
        memcpy(p->name, shown, len + 1);
    size_t prog_len = HP_MIN(a0 - (size_t)(shown - title), sizeof(p->prog) - 1);
    if (retitled)
        snprintf(p->prog, sizeof(p->prog), "%s", p->comm);
    else
        snprintf(p->prog, sizeof(p->prog), "%.*s", (int)prog_len, shown);
}

/* @p's effective uid (/proc/PID/status) and whether it is dumpable: the kernel gives a
 * process's /proc files to root when it is not (its directory keeps its owner). */
static void proc_owner(struct svc_proc *p)
{
    char path[64], buf[4096];
    size_t n = 0;
    struct stat st;
    p->uid = (uid_t)-1;
    p->dumpable = true;
    snprintf(path, sizeof(path), "/proc/%d/status", (int)p->pid);
    if (svc__read_small(path, buf, sizeof(buf) - 1, &n) == 0) {
        buf[n] = '\0';
        const char *u = strstr(buf, "\nUid:");
        unsigned ruid, euid;
        if (u && sscanf(u + 5, "%u %u", &ruid, &euid) == 2)
            p->uid = (uid_t)euid;
    }
    snprintf(path, sizeof(path), "/proc/%d/stat", (int)p->pid);
    if (p->uid != 0 && p->uid != (uid_t)-1 && stat(path, &st) == 0 && st.st_uid == 0)
        p->dumpable = false;
}

/* The SVC_NS_* namespaces of @pid that are not ours (0 for those we may not look at). */
static unsigned proc_other_ns(pid_t pid)
{
    static const struct {
        const char *name;
        unsigned bit;
    } kinds[] = {
        {"mnt", SVC_NS_MNT}, {"pid", SVC_NS_PID}, {"net", SVC_NS_NET}, {"user", SVC_NS_USER}};
    unsigned other = 0;
    for (size_t i = 0; i < HP_ARRAY_SIZE(kinds); i++) {
        char path[64], self[64];
        struct stat theirs, ours;
        snprintf(path, sizeof(path), "/proc/%d/ns/%s", (int)pid, kinds[i].name);
        snprintf(self, sizeof(self), "/proc/self/ns/%s", kinds[i].name);
        if (stat(path, &theirs) == 0 && stat(self, &ours) == 0 &&
            (theirs.st_ino != ours.st_ino || theirs.st_dev != ours.st_dev))
            other |= kinds[i].bit;
    }
    return other;
}

/* @uid (in our user namespace) as the user namespace of @pid sees it, from its uid_map
 * text @map; -1 when it is not mapped there. */
static long proc_uid_inside(const char *map, uid_t uid)
{
    for (const char *l = map; l && *l;) {
        unsigned long in, out, count;
        if (sscanf(l, "%lu %lu %lu", &in, &out, &count) == 3 && uid >= out && uid - out < count)
            return (long)(in + (uid - out));
        l = strchr(l, '\n');
        if (l)
            l++;
    }
    return -1;
}

/* In @p's user namespace (another one), is our effective uid its root or its own user? */
static bool proc_user_mapped(const struct svc_proc *p)
{
    char path[64], map[4096];
    size_t n = 0;
    snprintf(path, sizeof(path), "/proc/%d/uid_map", (int)p->pid);
    if (svc__read_small(path, map, sizeof(map) - 1, &n) < 0)
        return false;
    map[n] = '\0';
    long us = proc_uid_inside(map, geteuid());
    return us == 0 || (us > 0 && us == proc_uid_inside(map, p->uid));
}

bool svc_proc_in_container(const struct svc_proc *p)
{
    return (p->other_ns & (SVC_NS_MNT | SVC_NS_PID | SVC_NS_NET)) != 0;
}

int svc_proc_inspect(pid_t pid, struct svc_proc *ret)
{
    char path[64], buf[4096];
    size_t n = 0;
    struct stat st;

    memset(ret, 0, sizeof(*ret));
    ret->pid = pid;
    snprintf(path, sizeof(path), "/proc/%d", (int)pid);
    if (stat(path, &st) < 0)
        return -errno;
    proc_owner(ret);
    if (ret->uid == (uid_t)-1)
        ret->uid = st.st_uid;
    ret->same_user = ret->uid == geteuid();

    snprintf(path, sizeof(path), "/proc/%d/cmdline", (int)pid);
    if (svc__read_small(path, buf, sizeof(buf) - 1, &n) < 0)
        n = 0;
    buf[n] = '\0';
    proc_names(ret, buf, n);

    /* Who it is: the start time, which a reused pid does not share. */
    snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
    if (svc__read_small(path, buf, sizeof(buf) - 1, &n) == 0) {
        buf[n] = '\0';
        const char *p = strrchr(buf, ')');
        /* after the name: state is field 3, starttime field 22 */
        for (int field = 2; p && field < 22; field++)
            p = strchr(p + 1, ' ');
        if (p)
            ret->start_time = strtoull(p + 1, NULL, 10);
    }

    ret->other_ns = proc_other_ns(pid);
    ret->user_unmapped = (ret->other_ns & SVC_NS_USER) && !proc_user_mapped(ret);

    /* libheapprof.so mapped, its wake entry advertised? */
    HP_CLEANUP_FREE char *maps = svc__proc_maps(pid);
    if (!maps) {
        if (errno == ENOENT || errno == ESRCH)
            return -ENOENT;
        ret->maps_err = errno ? errno : EIO; /* svc_proc_check() says what that means */
        return 0;
    }
    ret->preloaded = strstr(maps, "/libheapprof.so") != NULL;
    ret->wake_page = svc__wake_page_addr(maps);
    ret->attach_ready = ret->wake_page != 0;
    return 0;
}

/* "www-data (uid 33)" for @uid in @buf. */
static const char *user_of(uid_t uid, char *buf, size_t len)
{
    struct passwd pw, *res = NULL;
    char tmp[1024];
    if (getpwuid_r(uid, &pw, tmp, sizeof(tmp), &res) == 0 && res)
        snprintf(buf, len, "%s (uid %u)", res->pw_name, (unsigned)uid);
    else
        snprintf(buf, len, "uid %u", (unsigned)uid);
    return buf;
}

int svc_proc_check(const struct svc_proc *p, bool other_users, char *why, size_t len)
{
    uid_t me = geteuid();
    char them[160], us[160];
    bool other = p->uid != me && !(me == 0 && other_users);
    /* Said first: for it, running as another user does not help. */
    if (!p->dumpable && (me != 0 || other)) {
        snprintf(why, len,
                 "is not dumpable (it called prctl(PR_SET_DUMPABLE, 0), as ssh-agent and "
                 "gpg-agent do, or changed its user ids): only root may read its memory and "
                 "wake it, %s",
                 p->uid == 0 ? "so attach as root"
                             : "and root cannot attach another user's process; profile it from "
                               "its start instead (heapprof record -- COMMAND)");
        return -EPERM;
    }
    if (other) {
        snprintf(why, len,
                 "runs as user %s, not as %s: a process connects only to a session of its "
                 "own user",
                 user_of(p->uid, them, sizeof(them)), user_of(me, us, sizeof(us)));
        return -EACCES;
    }
    if (p->maps_err == EACCES || p->maps_err == EPERM)
        return svc__wake_no_permission(p->maps_err, why, len);
    if (p->maps_err) {
        snprintf(why, len, "cannot be read: %s", strerror(p->maps_err));
        return -EPERM;
    }
    if (p->user_unmapped) {
        /* Its client would see us as nobody (SO_PEERCRED) and refuse us. */
        snprintf(why, len,
                 "runs in another user namespace (a rootless container?) where this "
                 "heapprof's user (uid %u) is neither root nor its own user: run heapprof "
                 "inside that namespace (nsenter -t %d -U -m -p -n, or the container's exec) "
                 "and attach from there",
                 (unsigned)geteuid(), (int)p->pid);
        return -EOPNOTSUPP;
    }
    if (!p->preloaded && !svc_inject_library()) {
        snprintf(why, len,
                 "does not have libheapprof.so loaded, and no readable libheapprof.so was "
                 "found to load into it (set HEAPPROF_LIB to its path), or start it with "
                 "LD_PRELOAD=/path/to/libheapprof.so");
        return -ENOPKG;
    }
    return 0;
}

int svc_proc_attach_daemon(struct svc *s, const struct svc_proc *p, bool other_users, char *why,
                           size_t len)
{
    int r = svc_proc_check(p, other_users, why, len);
    if (r == -EACCES) {
        size_t n = strlen(why);
        snprintf(why + n, len - n,
                 "; heapprofd takes other users' processes when it runs as "
                 "root with --allow-other-users");
    }
    return r < 0 ? r : svc_proc_attach_for(s, p, 0, why, len, NULL);
}

int svc_proc_attach_for(struct svc *s, const struct svc_proc *p, pid_t attacher, char *why,
                        size_t len, struct svc_rcall_stats *stats)
{
    if (stats)
        *stats = (struct svc_rcall_stats){0};
    if (!svc_proc_in_container(p))
        return svc_proc_attach(p, attacher, NULL, why, len, stats);
    /* Our socket is out of its reach: one inside its root, whose peer is this process
     * (its pid as the process sees it, or 0 from another pid namespace: svc_proc_attach),
     * also for the daemon, whose own socket @attacher 0 names otherwise. */
    char in_path[HP_WAKE_PATH_MAX];
    int r = svc_listen_in(s, p->pid, p->uid, in_path, sizeof(in_path));
    if (r < 0) {
        snprintf(why, len,
                 "lives in a container and no socket could be made for it inside its root "
                 "(in its /tmp or /dev/shm): %s",
                 strerror(-r));
        return r;
    }
    r = svc_proc_attach(p, getpid(), in_path, why, len, stats);
    if (r < 0)
        svc_unlisten_in(s, p->pid);
    return r;
}

int svc_proc_attach(const struct svc_proc *p, pid_t attacher, const char *sock_path, char *why,
                    size_t len, struct svc_rcall_stats *stats)
{
    if (stats)
        *stats = (struct svc_rcall_stats){0};
    /* In a container the client connects where it was told, to a peer it cannot see. */
    if (sock_path && (p->other_ns & SVC_NS_PID))
        attacher = 0;
    if (p->preloaded)
        return svc_proc_wake_to(p, attacher, sock_path, why, len);
    /* Without a socket of its own (not in a container), only where it sees our library. */
    int r = svc_proc_inject_ex(p, sock_path != NULL, why, len, stats);
    if (r < 0)
        return r;
    /* The constructor advertised the wake entry inside the dlopen. */
    struct svc_proc now;
    r = svc_proc_inspect(p->pid, &now);
    if (r < 0 || now.start_time != p->start_time) {
        snprintf(why, len, "exited");
        return -ESRCH;
    }
    if (!now.attach_ready) {
        snprintf(why, len, "loaded libheapprof.so but advertises no wake entry");
        return -EPROTO;
    }
    return svc_proc_wake_to(&now, attacher, sock_path, why, len);
}

void svc_proc_scan_targets(const struct svc_config *cfg,
                           void (*fn)(void *ctx, const struct svc_proc *p), void *ctx)
{
    DIR *d = opendir("/proc");
    if (!d)
        return;
    struct dirent *e;
    pid_t self = getpid();
    while ((e = readdir(d)) != NULL) {
        char *end;
        long pid = strtol(e->d_name, &end, 10);
        if (*end || pid <= 0 || pid == self)
            continue;
        char path[64], cmd[4096], comm[SVC_COMM_LEN];
        size_t n = 0;
        snprintf(path, sizeof(path), "/proc/%ld/cmdline", pid);
        if (svc__read_small(path, cmd, sizeof(cmd), &n) < 0)
            continue;
        if (!svc_config_matches(cfg, (int32_t)pid, svc_proc_comm((pid_t)pid, comm, sizeof(comm)),
                                cmd, n))
            continue;
        struct svc_proc p;
        if (svc_proc_inspect((pid_t)pid, &p) < 0 || (!p.preloaded && cfg->all))
            continue;
        fn(ctx, &p);
    }
    closedir(d);
}
