/* service/targets.h: the processes an attach session or the daemon profiles: finding
 * them in /proc and sending them the attach signal (service/targets.c). */
#ifndef HP_SERVICE_TARGETS_H
#define HP_SERVICE_TARGETS_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "service/config.h"

/* Target discovery for attach. A process is attachable once its client installed the
 * attach handler: the client then maps a memfd named "heapprof-attach-<signo>" (see
 * preload/attach.c), so we signal only processes that show it, with that signal, and only
 * while the signal is caught. */
struct svc_proc {
    pid_t pid;
    char name[64];  /* basename of argv[0] */
    bool preloaded; /* libheapprof.so mapped */
    bool same_user;
    int attach_signo;    /* the signal its attach handler was installed for; 0: none yet */
    bool attach_ready;   /* attach_signo advertised, and caught (SigCgt) */
    uint64_t start_time; /* /proc/PID/stat starttime: the process's identity with its pid */
};
/* Reads /proc/@pid: 0, -ENOENT (gone), -errno. */
int svc_proc_inspect(pid_t pid, struct svc_proc *ret);
/* Calls @fn for every running process but ours that matches @cfg's targets and has
 * libheapprof.so mapped (ready to attach or not). */
void svc_proc_scan_targets(const struct svc_config *cfg,
                           void (*fn)(void *ctx, const struct svc_proc *p), void *ctx);
/* Sends the process @p describes its advertised attach signal, carrying @attacher (0:
 * the daemon) with SI_QUEUE, through a pidfd, after checking that the pid still names
 * the process inspected (its start time) and that the handler is still there. Returns 0,
 * -EAGAIN (no handler installed: still starting, disabled, or another handler), -ESRCH
 * (gone, or its pid now names another process), or -errno. */
int svc_proc_signal_attach(const struct svc_proc *p, pid_t attacher);

#endif
