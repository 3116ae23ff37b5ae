/* service/wake.h: the thread choice and the restart rule of the wake (service/wake.c),
 * as pure functions, for the unit test. svc_proc_wake() itself is in service/targets.h.
 *
 *     enum svc_wake_look l = svc_wake_look('S', "232 0x3 0x7ffc 0x1 0xffffffff 0 0 0x7f 0x7f");
 *     // SVC_WAKE_IDLE_EINTR: epoll_wait(-1), restarted exactly after the call
 *     bool again = svc_wake_restart(232, -EINTR, false); // true
 */
#ifndef HP_SERVICE_WAKE_H
#define HP_SERVICE_WAKE_H

#include <stdbool.h>

/* What a look at a thread (/proc/PID/task/TID/stat's state, .../syscall) says. */
enum svc_wake_look {
    SVC_WAKE_SKIP,       /* not now and not soon: D state (no prompt stop), zombie, gone */
    SVC_WAKE_LATER,      /* in a call a stop would end early (EINTR, finite timeout): look
                            again, take it once it runs or waits in another call */
    SVC_WAKE_IDLE,       /* in a call a stop restarts transparently: the best choice */
    SVC_WAKE_IDLE_EINTR, /* in a call a stop ends with EINTR, no timeout: taken, and the
                            call is restarted exactly afterwards */
    SVC_WAKE_RUNNING,    /* running, or blocked outside a system call */
};

/* @state: the thread's state letter; @syscall_text: the contents of its syscall file
 * ("running", "-1 SP PC", or "NR ARG1..ARG6 SP PC"). */
enum svc_wake_look svc_wake_look(char state, const char *syscall_text);

/* True when a call that ended with EINTR at our stop must be restarted exactly (rax =
 * orig_rax, rip back over the syscall instruction): the thread was stopped in a system
 * call (@orig_rax >= 0), it returned -EINTR (@rax), and no real signal is pending for the
 * thread (@signal_pending: then the EINTR is the program's). Calls that restart by
 * themselves (-ERESTART*) are left to the kernel. */
bool svc_wake_restart(long long orig_rax, long long rax, bool signal_pending);

/* True for the system calls that a ptrace stop ends with EINTR instead of restarting
 * (measured on Linux 6.18): epoll_wait, epoll_pwait, epoll_pwait2, semop, semtimedop,
 * rt_sigtimedwait, io_getevents, io_pgetevents. */
bool svc_wake_eintr_call(long nr);

#endif
