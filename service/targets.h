/* service/targets.h: the processes an attach session or the daemon profiles: finding
 * them in /proc (service/targets.c) and waking their dormant clients (service/wake.c). */
#ifndef HP_SERVICE_TARGETS_H
#define HP_SERVICE_TARGETS_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "service/config.h"
#include "service/rcall.h"

struct svc;

/* /proc/PID/comm's size, its NUL included. */
#define SVC_COMM_LEN 16

/* Target discovery for attach. A process is attachable once its client advertises its
 * wake entry: the client then maps a memfd page named "heapprof-attach-wake" (see
 * preload/wake.c, common/wake.h), which we find in its maps. */
struct svc_proc {
    pid_t pid;
    /* For messages, its title as `ps` shows it: "postgres: checkpointer", "nginx: master
     * process /usr/sbin/nginx", or "worker --threads 4" (argv[0] as its basename when it
     * is a path, not a title); cut at 63 bytes. Its comm when the command line is empty. */
    char name[64];
    char prog[64];           /* for file names: argv[0]'s basename, or comm when retitled */
    char comm[SVC_COMM_LEN]; /* /proc/PID/comm, which `pgrep NAME` matches */
    uid_t uid;               /* effective uid */
    bool dumpable;           /* false: prctl(PR_SET_DUMPABLE, 0) or changed ids (its /proc files are
                                root's); a root process always counts as dumpable */
    int maps_err;            /* 0, or why /proc/PID/maps could not be read (EACCES: not allowed) */
    bool preloaded;          /* libheapprof.so mapped */
    bool same_user;          /* its effective uid is ours */
    uint64_t wake_page;      /* address of its advertisement page; 0: none (yet) */
    bool attach_ready;       /* advertised (wake_page != 0); the page is checked by the wake */
    uint64_t start_time;     /* /proc/PID/stat starttime: the process's identity with its pid */
    unsigned other_ns;       /* SVC_NS_* bits: the namespaces it does not share with us (0
                                when its /proc/PID/ns cannot be read) */
    bool user_unmapped;      /* in another user namespace, where our effective uid is
                                neither its root nor its own user (a rootless container's
                                host root is nobody there): its client would refuse us */
};
#define SVC_NS_MNT 1u
#define SVC_NS_PID 2u
#define SVC_NS_NET 4u
#define SVC_NS_USER 8u
/* True when @p cannot reach the service's own socket, or the service cannot tell its
 * client by its pid: it lives in another mount, pid or network namespace (a container).
 * heapprof attach and heapprofd make it a socket of its own inside its root
 * (svc_proc_attach_for()). */
bool svc_proc_in_container(const struct svc_proc *p);
/* Reads /proc/@pid: 0, -ENOENT (gone), -errno. */
int svc_proc_inspect(pid_t pid, struct svc_proc *ret);
/* /proc/@pid/comm in @buf (@len bytes), or NULL when it cannot be read. */
const char *svc_proc_comm(pid_t pid, char *buf, size_t len);
/* Why the process @p describes cannot be attached by us, before any attempt: 0 when
 * nothing stands in the way, else a one-line reason that follows "pid N (name) " in
 * @why, with -EACCES (it runs as another user, and @other_users does not let a root
 * service take it: the caller adds what to do), -EPERM (not dumpable, or its maps not
 * readable: what is needed), -ENOPKG (no libheapprof.so mapped, and none to load: see
 * svc_inject_set_library()). */
int svc_proc_check(const struct svc_proc *p, bool other_users, char *why, size_t len);
/* What a daemon does with a running target @p it found: svc_proc_check() (other users'
 * processes when @other_users, heapprofd --allow-other-users), then svc_proc_attach_for()
 * with @s, whose socket is the daemon's. Returns as those, the reason in @why, with what
 * to do for -EACCES. */
int svc_proc_attach_daemon(struct svc *s, const struct svc_proc *p, bool other_users, char *why,
                           size_t len);
/* Calls @fn for every running process but ours that matches @cfg's targets: with
 * libheapprof.so mapped (ready to attach or not), or, unless @cfg takes every process,
 * any (svc_proc_check() says why one without it, or that we may not read, is not
 * attached). */
void svc_proc_scan_targets(const struct svc_config *cfg,
                           void (*fn)(void *ctx, const struct svc_proc *p), void *ctx);
/* Wakes the dormant client of the process @p describes, telling it to connect to
 * @attacher's socket (0: the daemon's): a ptrace remote call of the entry its page
 * advertises, on one thread, which is put back exactly as it was (service/wake.c). No
 * signal is sent. Checks first that the pid still names the process inspected (its start
 * time, through a pidfd). Returns 0; -EAGAIN (not advertised: still starting, or
 * attaching disabled; @why empty); or, with a one-line reason in @why that follows "pid N
 * (name) ": -ESRCH (gone), -EBUSY (stopped or traced), -EOPNOTSUPP (seccomp), -EPERM (no
 * permission to trace; what is needed), -EALREADY (in a session already: its service
 * named; or attached by another session right now), -EPROTO (a page of another version),
 * -ETIMEDOUT (no thread could be taken safely), -EIO (the call failed, or its session
 * thread could not start; the process unharmed).
 * Blocks up to a few seconds. Blocks SIGINT, SIGTERM, SIGHUP and SIGQUIT in the calling
 * thread meanwhile. */
int svc_proc_wake(const struct svc_proc *p, pid_t attacher, char *why, size_t why_len);
/* As svc_proc_wake(), telling the client to connect to @sock_path (a path in its own
 * root; NULL: @attacher's socket) with @attacher its pid as the process sees it (0:
 * outside its pid namespace). -EPROTO also when its library cannot take a path. */
int svc_proc_wake_to(const struct svc_proc *p, pid_t attacher, const char *sock_path, char *why,
                     size_t why_len);
/* Attaches @p whether or not it was started with the library: svc_proc_wake() when it has
 * libheapprof.so, else svc_proc_inject() (service/inject.h) and then the wake. A process
 * in a container (svc_proc_in_container()) is told to connect to @sock_path, a socket made
 * for it inside its root (svc_listen_in()), and the library is handed over in a memfd
 * where its root has another file at its path; without @sock_path such a process is
 * refused (-EXDEV): svc_proc_attach_for() makes the socket. Returns as those; @stats (may be NULL):
 * the injection's thread and stop time (zero without one). */
int svc_proc_attach(const struct svc_proc *p, pid_t attacher, const char *sock_path, char *why,
                    size_t len, struct svc_rcall_stats *stats);
/* svc_proc_attach() for the service @s (this process's): a process in a container
 * (svc_proc_in_container()) is told to connect to a socket @s makes for it inside its root
 * (svc_listen_in(), removed again when the attach fails), its peer us; the others to
 * @attacher's socket, as svc_proc_attach(). Returns as that, also when no socket could be
 * made (the reason in @why). */
int svc_proc_attach_for(struct svc *s, const struct svc_proc *p, pid_t attacher, char *why,
                        size_t len, struct svc_rcall_stats *stats);
/* The reason tracing a process needs, after ptrace or a read of its memory said @err:
 * -EPERM, the reason in @why (service/wake.c). */
int svc__wake_no_permission(int err, char *why, size_t len);
/* The address of the wake page in the text of /proc/PID/maps, or 0 (service/wake.c). */
uint64_t svc__wake_page_addr(const char *maps);
/* The text of /proc/@pid/maps (malloc'd; the caller frees), or NULL with errno set. */
char *svc__proc_maps(pid_t pid);

/* Reads up to @len bytes of the file at @path (a /proc file: read until EOF) into @buf,
 * not terminated; sets *@ret_n. Returns 0 or -errno. */
int svc__read_small(const char *path, char *buf, size_t len, size_t *ret_n);

#endif
