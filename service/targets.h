/* service/targets.h: the processes an attach session or the daemon profiles: finding
 * them in /proc (service/targets.c) and waking their dormant clients (service/wake.c). */
#ifndef HP_SERVICE_TARGETS_H
#define HP_SERVICE_TARGETS_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "service/config.h"

/* Target discovery for attach. A process is attachable once its client advertises its
 * wake entry: the client then maps a memfd page named "heapprof-attach-wake" (see
 * preload/wake.c, common/wake.h), which we find in its maps. */
struct svc_proc {
    pid_t pid;
    char name[64];  /* basename of argv[0] */
    bool preloaded; /* libheapprof.so mapped */
    bool same_user;
    uint64_t wake_page;  /* address of its advertisement page; 0: none (yet) */
    bool attach_ready;   /* advertised (wake_page != 0); the page is checked by the wake */
    uint64_t start_time; /* /proc/PID/stat starttime: the process's identity with its pid */
};
/* Reads /proc/@pid: 0, -ENOENT (gone), -errno. */
int svc_proc_inspect(pid_t pid, struct svc_proc *ret);
/* Calls @fn for every running process but ours that matches @cfg's targets and has
 * libheapprof.so mapped (ready to attach or not). */
void svc_proc_scan_targets(const struct svc_config *cfg,
                           void (*fn)(void *ctx, const struct svc_proc *p), void *ctx);
/* Wakes the dormant client of the process @p describes, telling it to connect to
 * @attacher's socket (0: the daemon's): a ptrace remote call of the entry its page
 * advertises, on one thread, which is put back exactly as it was (service/wake.c). No
 * signal is sent. Checks first that the pid still names the process inspected (its start
 * time, through a pidfd). Returns 0; -EAGAIN (not advertised: still starting, or
 * attaching disabled; @why empty); or, with a one-line reason in @why that follows "pid N
 * (name) ": -ESRCH (gone), -EBUSY (stopped or traced), -EOPNOTSUPP (seccomp), -EPERM (no
 * permission to trace; what is needed), -EPROTO (a page of another version), -ETIMEDOUT
 * (no thread could be taken safely), -EIO (the call failed; the process unharmed).
 * Blocks up to a few seconds. Blocks SIGINT, SIGTERM, SIGHUP and SIGQUIT in the calling
 * thread meanwhile. */
int svc_proc_wake(const struct svc_proc *p, pid_t attacher, char *why, size_t why_len);
/* The address of the wake page in the text of /proc/PID/maps, or 0 (service/wake.c). */
uint64_t svc__wake_page_addr(const char *maps);
/* The text of /proc/@pid/maps (malloc'd; the caller frees), or NULL with errno set. */
char *svc__proc_maps(pid_t pid);

#endif
