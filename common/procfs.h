/* common/procfs.h: facts about a process read from /proc, shared by the service's
 * handshake and the unwinder.
 *
 *     pid_t inner = hp_proc_ns_pid(pid);   // its pid in its own pid namespace
 */
#ifndef HP_COMMON_PROCFS_H
#define HP_COMMON_PROCFS_H

#include <stddef.h>
#include <sys/types.h>

/* The last pid of the "NSpid:" line in the @len bytes of /proc/PID/status text @status
 * (the process's pid in its innermost pid namespace), or @fallback when there is none
 * (a kernel before 4.1) or it is not a pid. */
pid_t hp_status_ns_pid(const char *status, size_t len, pid_t fallback);

/* @pid's pid in its own pid namespace, from /proc/@pid/status; @pid itself when that is
 * unreadable or says nothing (same namespace as ours, or an old kernel). */
pid_t hp_proc_ns_pid(pid_t pid);

#endif
