/* service/wake.c: waking a dormant client with a ptrace remote call, no signal.
 *
 * A process started with libheapprof.so advertises, in a read-only memfd page
 * (common/wake.h), the address of client_wake_entry() and of an int3 to return to. To
 * wake it we stop ONE of its threads (PTRACE_SEIZE + PTRACE_INTERRUPT: no SIGSTOP, the
 * other threads keep running), make it call the entry with our pid, catch the return at
 * the int3, put back every register, the extended state and the signal mask, and
 * detach. The entry only starts the client's session thread (preload/attach.c), which
 * then handshakes with us.
 *
 * What the program could notice, and why it does not:
 *   - Its system call. A ptrace stop restarts most blocking calls transparently (poll,
 *     select, nanosleep, futex, read: -ERESTART* at the stop), but epoll_wait,
 *     epoll_pwait(2), semop, semtimedop, rt_sigtimedwait and io_(p)getevents return
 *     EINTR (-4 at the stop). A thread waiting in one of those with no timeout is taken
 *     and its call restarted exactly (rax = orig_rax, rip back over the 0f 05), which is
 *     what it was doing; one with a finite timeout is left alone until it runs or waits
 *     in another call (restarting it would wait longer than asked). A thread seen
 *     running that entered such a call in the few hundred microseconds before our stop
 *     is restarted the same way: its call ends that much late, like after a scheduler
 *     delay, never early. Not when a real signal is pending for it: that EINTR is the
 *     program's.
 *   - Signals. None is sent. During the call every signal but SIGTRAP is blocked
 *     (PTRACE_SETSIGMASK; its GET returns the program's own mask even inside ppoll or
 *     epoll_pwait, and the restarted call sets its temporary mask again). SIGTRAP stays
 *     deliverable because the int3 forces it, and a forced signal that is blocked resets
 *     the program's handler to SIG_DFL. A signal that reaches the thread while we hold it
 *     is kept and delivered at the detach, with its siginfo.
 *   - Its state. Registers, NT_X86_XSTATE (the AVX upper halves), the mask; errno is
 *     kept by the entry. The frame is built below the red zone. Not inside an rseq
 *     critical section (the kernel would evaluate the abort against our pc), with 16 KiB
 *     of stack below sp.
 *
 * Refused, with the reason: stopped or traced processes, seccomp filters (a filter may
 * kill the process for a call the session thread makes: clone, socket, mmap...), and
 * no permission to trace (same user and a dumpable process, Yama's ptrace_scope,
 * CAP_SYS_PTRACE). Threads in D state are skipped: they do not stop promptly.
 *
 * ptrace is per thread: the thread that calls svc_proc_wake() is the tracer and does the
 * whole sequence, so it works from any thread of a multi-threaded service. It waits for
 * its tracee by tid (waitpid(tid, __WALL)); a waitpid(-1) in another thread of the same
 * process could take the stop from it, so callers reap children only from the thread
 * that wakes (cli/loop.c does both from its loop). SIGINT, SIGTERM, SIGHUP and SIGQUIT
 * are blocked in the caller for the time of the call: a tracer killed then would leave
 * the thread to run into the int3. */
#include "service/wake.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ptrace.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/user.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/log.h"
#include "common/macros.h"
#include "common/wake.h"
#include "service/rcall.h"
#include "service/svc.h"
#include "service/targets.h"

#ifndef PTRACE_GET_RSEQ_CONFIGURATION
#define PTRACE_GET_RSEQ_CONFIGURATION 0x420f
#endif
#ifndef NT_X86_XSTATE
#define NT_X86_XSTATE 0x202
#endif

/* How long a wake may look for a thread it can take, and wait for a stop or the call. */
#define WAKE_CHOOSE_NS 5000000000ull
#define WAKE_STOP_NS 10000000000ull
#define WAKE_CALL_NS 5000000000ull
/* Stack the call may use below the thread's sp (the entry needs a few hundred bytes). */
#define WAKE_HEADROOM 16384u
#define WAKE_RED_ZONE 128u
#define WAKE_XSTATE_MAX 65536u
#define WAKE_MAX_KEPT 8
#define X86_DF 0x400ull

/* ---- the pure part ------------------------------------------------------------------ */

bool svc_wake_eintr_call(long nr)
{
    switch (nr) {
    case SYS_epoll_wait:
    case SYS_epoll_pwait:
#ifdef SYS_epoll_pwait2
    case SYS_epoll_pwait2:
#endif
    case SYS_semop:
    case SYS_semtimedop:
    case SYS_rt_sigtimedwait:
    case SYS_io_getevents:
#ifdef SYS_io_pgetevents
    case SYS_io_pgetevents:
#endif
        return true;
    default:
        return false;
    }
}

/* True when the EINTR call @nr with arguments @a waits without a time limit. */
static bool wake_call_untimed(long nr, const unsigned long long a[6])
{
    switch (nr) {
    case SYS_epoll_wait:
    case SYS_epoll_pwait:
        return (int)(uint32_t)a[3] < 0; /* int timeout, negative: no limit */
#ifdef SYS_epoll_pwait2
    case SYS_epoll_pwait2:
        return a[3] == 0; /* const struct timespec *timeout */
#endif
    case SYS_semop:
        return true;
    case SYS_semtimedop:
        return a[3] == 0;
    case SYS_rt_sigtimedwait:
        return a[2] == 0;
    case SYS_io_getevents:
#ifdef SYS_io_pgetevents
    case SYS_io_pgetevents:
#endif
        return a[4] == 0;
    default:
        return false;
    }
}

enum svc_wake_look svc_wake_look(char state, const char *syscall_text)
{
    if (state != 'R' && state != 'S')
        return SVC_WAKE_SKIP; /* D, T, t, Z, X, ... */
    if (!syscall_text || strncmp(syscall_text, "running", 7) == 0)
        return SVC_WAKE_RUNNING;
    char *end;
    long nr = strtol(syscall_text, &end, 10);
    if (end == syscall_text)
        return SVC_WAKE_SKIP;
    if (nr < 0)
        return SVC_WAKE_RUNNING; /* blocked outside a system call (a page fault) */
    if (!svc_wake_eintr_call(nr))
        return SVC_WAKE_IDLE;
    unsigned long long a[6];
    const char *p = end;
    for (int i = 0; i < 6; i++) {
        a[i] = strtoull(p, &end, 16);
        if (end == p)
            return SVC_WAKE_LATER; /* unreadable: do not guess */
        p = end;
    }
    return wake_call_untimed(nr, a) ? SVC_WAKE_IDLE_EINTR : SVC_WAKE_LATER;
}

bool svc_wake_restart(long long orig_rax, long long rax, bool signal_pending)
{
    return orig_rax >= 0 && rax == -EINTR && !signal_pending;
}

/* ---- /proc ---------------------------------------------------------------------------- */

/* Reads @path into @buf (NUL-terminated). Returns the length or -errno. */
static ssize_t wake_read(const char *path, char *buf, size_t cap)
{
    size_t n;
    int r = svc__read_small(path, buf, cap - 1, &n);
    if (r < 0)
        return r;
    buf[n] = '\0';
    return (ssize_t)n;
}

char *svc__proc_maps(pid_t pid)
{
    char path[64];
    snprintf(path, sizeof(path), "/proc/%d/maps", (int)pid);
    HP_CLEANUP_CLOSE int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return NULL;
    size_t cap = 65536, n = 0;
    char *buf = malloc(cap);
    while (buf) {
        if (n + 1 >= cap) {
            char *more = realloc(buf, cap * 2);
            if (!more)
                break;
            buf = more;
            cap *= 2;
        }
        ssize_t k = read(fd, buf + n, cap - 1 - n);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0) {
            buf[n] = '\0';
            return buf;
        }
        n += (size_t)k;
    }
    free(buf);
    errno = ENOMEM;
    return NULL;
}

/* The maps line holding @addr: its bounds, permissions (4 chars) and path. */
struct wake_map {
    uint64_t start, end;
    char perms[5];
    const char *path; /* into the maps text, up to the newline */
    size_t path_len;
};

static bool wake_map_of(const char *maps, uint64_t addr, struct wake_map *ret)
{
    for (const char *l = maps; l && *l;) {
        const char *nl = strchr(l, '\n');
        unsigned long long s, e;
        char perms[5];
        int off = 0;
        if (sscanf(l, "%llx-%llx %4s %*s %*s %*s%n", &s, &e, perms, &off) == 3 && addr >= s &&
            addr < e) {
            const char *p = l + off;
            const char *stop = nl ? nl : p + strlen(p);
            while (p < stop && *p == ' ')
                p++;
            *ret =
                (struct wake_map){.start = s, .end = e, .path = p, .path_len = (size_t)(stop - p)};
            memcpy(ret->perms, perms, sizeof(perms));
            return true;
        }
        l = nl ? nl + 1 : NULL;
    }
    return false;
}

static bool wake_map_path_ends(const struct wake_map *m, const char *suffix)
{
    size_t k = strlen(suffix), n = m->path_len;
    /* "/usr/lib/libheapprof.so" or "... (deleted)" */
    const char *del = " (deleted)";
    if (n > strlen(del) && memcmp(m->path + n - strlen(del), del, strlen(del)) == 0)
        n -= strlen(del);
    return n >= k && memcmp(m->path + n - k, suffix, k) == 0;
}

uint64_t svc__wake_page_addr(const char *maps)
{
    const char *name = "/memfd:" HP_WAKE_MEMFD_NAME;
    for (const char *hit = strstr(maps, name); hit; hit = strstr(hit + 1, name)) {
        const char *after = hit + strlen(name);
        if (*after != ' ' && *after != '\n' && *after != '\0')
            continue;
        const char *l = hit;
        while (l > maps && l[-1] != '\n')
            l--;
        unsigned long long s;
        if (sscanf(l, "%llx-", &s) == 1)
            return s;
    }
    return 0;
}

/* The value of "@key" (e.g. "TracerPid:") in a status text, as a string (up to the
 * newline, leading blanks skipped), or NULL. */
static const char *wake_status_field(const char *status, const char *key, char *buf, size_t cap)
{
    size_t k = strlen(key);
    for (const char *l = status; l && *l;) {
        if (strncmp(l, key, k) == 0) {
            const char *p = l + k;
            while (*p == ' ' || *p == '\t')
                p++;
            size_t n = strcspn(p, "\n");
            snprintf(buf, cap, "%.*s", (int)HP_MIN(n, cap - 1), p);
            return buf;
        }
        l = strchr(l, '\n');
        if (l)
            l++;
    }
    return NULL;
}

static unsigned long long wake_status_hex(const char *status, const char *key)
{
    char v[64];
    return wake_status_field(status, key, v, sizeof(v)) ? strtoull(v, NULL, 16) : 0;
}

/* True when a signal the thread @tid of @pid does not block is pending for it. */
static bool wake_signal_pending(pid_t pid, pid_t tid)
{
    char path[96], st[8192];
    snprintf(path, sizeof(path), "/proc/%d/task/%d/status", (int)pid, (int)tid);
    if (wake_read(path, st, sizeof(st)) < 0)
        return true; /* cannot tell: leave the call alone */
    unsigned long long pend = wake_status_hex(st, "SigPnd:") | wake_status_hex(st, "ShdPnd:");
    return (pend & ~wake_status_hex(st, "SigBlk:")) != 0;
}

/* ---- refusals --------------------------------------------------------------------- */

int svc__why(char *why, size_t len, int r, const char *fmt, ...)
{
    if (why && len) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(why, len, fmt, ap);
        va_end(ap);
    }
    return r;
}

/* What tracing @pid needs, after PTRACE_SEIZE or process_vm_readv said @err. */
int svc__wake_no_permission(int err, char *why, size_t len)
{
    char scope[16] = "";
    char yama[160] = "";
    if (wake_read("/proc/sys/kernel/yama/ptrace_scope", scope, sizeof(scope)) > 0) {
        int s = atoi(scope);
        if (s >= 1)
            snprintf(yama, sizeof(yama), "; Yama's ptrace_scope is %d (%s)", s,
                     s == 1   ? "only a parent process or CAP_SYS_PTRACE may trace; set it to 0"
                     : s == 2 ? "only CAP_SYS_PTRACE may trace"
                              : "nobody may trace until reboot");
    }
    return svc__why(why, len, -EPERM,
                    "may not be traced by this process (%s): attaching needs the same user and a "
                    "dumpable process, or CAP_SYS_PTRACE (root)%s",
                    strerror(err), yama);
}

#define WAKE_TRACE_STOP_MS 200

/* Refuses a process that exited (a zombie), is stopped, traced, or under seccomp (any
 * thread). */
static int wake_preflight(pid_t pid, char *why, size_t len)
{
    char path[96], st[8192], v[64];
    snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
    if (wake_read(path, st, sizeof(st)) < 0)
        return svc__why(why, len, -ESRCH, "exited");
    /* A zombie keeps its pid until reaped, with nothing mapped: it has exited. */
    if (wake_status_field(st, "State:", v, sizeof(v)) && (v[0] == 'Z' || v[0] == 'X'))
        return svc__why(why, len, -ESRCH, "exited");
    /* A tracing stop may be on its way out: the tracer of a wake that just ended (the
     * attach before this one) detaches as it goes, and on a busy machine the thread may
     * not have run since. Looked at again for up to WAKE_TRACE_STOP_MS; a debugger's stop
     * lasts, and is refused below. */
    for (int waited = 0; waited < WAKE_TRACE_STOP_MS &&
                         wake_status_field(st, "State:", v, sizeof(v)) && v[0] == 't';
         waited += 5) {
        struct timespec ts = {0, 5 * 1000 * 1000};
        (void)nanosleep(&ts, NULL);
        if (wake_read(path, st, sizeof(st)) < 0)
            return svc__why(why, len, -ESRCH, "exited");
    }
    if (wake_status_field(st, "State:", v, sizeof(v)) && (v[0] == 'T' || v[0] == 't'))
        return svc__why(why, len, -EBUSY,
                        "is stopped (State: %s); resume it (kill -CONT %d) and attach again", v,
                        (int)pid);
    if (wake_status_field(st, "TracerPid:", v, sizeof(v)) && atoi(v) != 0)
        return svc__why(why, len, -EBUSY,
                        "is being traced by pid %s (a debugger or strace); a process has one "
                        "tracer at a time",
                        v);
    if (wake_status_hex(st, "SigIgn:") & (1ull << (SIGTRAP - 1)))
        return svc__why(why, len, -EOPNOTSUPP,
                        "ignores SIGTRAP, which the wake call's return needs");

    snprintf(path, sizeof(path), "/proc/%d/task", (int)pid);
    DIR *d = opendir(path);
    if (!d)
        return svc__why(why, len, -ESRCH, "exited");
    int r = 0;
    struct dirent *e;
    while (r == 0 && (e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.')
            continue;
        int tid = atoi(e->d_name);
        snprintf(path, sizeof(path), "/proc/%d/task/%d/status", (int)pid, tid);
        if (wake_read(path, st, sizeof(st)) < 0)
            continue; /* exited meanwhile */
        if (wake_status_field(st, "Seccomp:", v, sizeof(v)) && atoi(v) != 0)
            r = svc__why(why, len, -EOPNOTSUPP,
                         "runs under seccomp (thread %d, Seccomp: %s): a filter may deny or kill "
                         "the process for a call the profiling session makes (clone, socket, "
                         "mmap...)",
                         tid, v);
    }
    closedir(d);
    return r;
}

/* ---- one thread --------------------------------------------------------------------- */

struct wake_ctx {
    pid_t pid;
    pid_t woken_tid; /* the thread that made the call */
    int answer;      /* the entry's return value, an HP_WAKE_* answer */
    pid_t attacher;
    const char *sock_path; /* for the entry; NULL: the attacher's own socket */
    struct hp_wake_page page;
    const struct svc_rcall_plan *plan; /* what to do on the thread taken */
    siginfo_t kept[WAKE_MAX_KEPT];     /* signals that reached the thread while we held it */
    int n_kept;
    char *why;
    size_t why_len;
    /* While a thread is taken: its registers at the stop, the lowest address the calls'
     * data reached (frames go below), whether it sits in a signal-delivery-stop (after a
     * call returned to the trap) and when its stop began. */
    pid_t tid;
    struct user_regs_struct base;
    uint64_t scratch;
    bool in_signal_stop;
    uint64_t stop_start_ns, stop_ns;
};

static void wake_sleep_us(long us)
{
    struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
    while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
        ;
}

/* Waits until @tid reports a state change, @ns at most: 1 with the status in @ret_st, 0
 * on timeout, -ESRCH when it is gone. */
static int wake_wait(pid_t tid, uint64_t ns, int *ret_st)
{
    uint64_t start = hp_clock_ns(CLOCK_MONOTONIC), end = start + ns;
    for (;;) {
        pid_t w = waitpid(tid, ret_st, __WALL | WNOHANG);
        if (w == tid)
            return 1;
        if (w < 0 && errno != EINTR)
            return -ESRCH;
        uint64_t now = hp_clock_ns(CLOCK_MONOTONIC);
        if (now >= end)
            return 0;
        /* The thread is stopped meanwhile (the program sees a pause): look every 20 us
         * for the first 20 ms, which the calls take, then every millisecond. */
        wake_sleep_us(now - start < 20000000u ? 20 : 1000);
    }
}

/* Keeps the signal of the signal-delivery-stop @tid is in, for the detach. */
static void wake_keep_signal(struct wake_ctx *c, pid_t tid, int sig)
{
    siginfo_t si;
    if (ptrace(PTRACE_GETSIGINFO, tid, 0, &si) < 0) {
        memset(&si, 0, sizeof(si));
        si.si_signo = sig;
        si.si_code = SI_USER;
    }
    if (c->n_kept < WAKE_MAX_KEPT)
        c->kept[c->n_kept++] = si;
}

/* After PTRACE_INTERRUPT: waits for the interrupt stop, keeping the signals that come
 * first. Returns 0, -EBUSY (a group stop: the process is being stopped), -ESRCH. */
static int wake_wait_interrupt(struct wake_ctx *c, pid_t tid)
{
    for (;;) {
        int st;
        int r = wake_wait(tid, WAKE_STOP_NS, &st);
        if (r == 0) /* not stopping (it was not in D state when we looked): wait on */
            r = waitpid(tid, &st, __WALL) == tid ? 1 : -ESRCH;
        if (r < 0 || !WIFSTOPPED(st))
            return -ESRCH;
        int event = st >> 16, sig = WSTOPSIG(st);
        if (event == PTRACE_EVENT_STOP)
            return sig == SIGTRAP ? 0 : -EBUSY;
        if (event == 0) { /* signal-delivery-stop: deliver it at the detach */
            wake_keep_signal(c, tid, sig);
            if (ptrace(PTRACE_CONT, tid, 0, 0) < 0)
                return -ESRCH;
            continue;
        }
        if (ptrace(PTRACE_CONT, tid, 0, 0) < 0) /* no other event was asked for */
            return -ESRCH;
    }
}

/* Detaches @tid (stopped), delivering the signals kept. @in_signal_stop: it is in a
 * signal-delivery-stop (a kept signal replaces that one). */
static void wake_detach(struct wake_ctx *c, pid_t tid, bool in_signal_stop)
{
    int first = 0;
    if (c->n_kept && in_signal_stop && ptrace(PTRACE_SETSIGINFO, tid, 0, &c->kept[0]) == 0)
        first = 1;
    (void)ptrace(PTRACE_DETACH, tid, 0, (void *)(long)(first ? c->kept[0].si_signo : 0));
    /* The rest (or all, outside a signal stop): sent again to the thread, their siginfo
     * lost; more than one in the few hundred microseconds of a wake is rare. */
    for (int i = first; i < c->n_kept; i++)
        (void)syscall(SYS_tgkill, c->pid, tid, c->kept[i].si_signo);
    c->n_kept = 0;
}

/* True when @rip of stopped @tid lies inside an rseq critical section. */
static bool wake_in_rseq(pid_t tid, uint64_t rip)
{
    struct {
        uint64_t rseq_abi_pointer;
        uint32_t rseq_abi_size, signature, flags, pad;
    } conf;
    if (ptrace(PTRACE_GET_RSEQ_CONFIGURATION, tid, sizeof(conf), &conf) < 0 ||
        !conf.rseq_abi_pointer)
        return false; /* no rseq (or a kernel that cannot say) */
    errno = 0;
    long cs = ptrace(PTRACE_PEEKDATA, tid, conf.rseq_abi_pointer + 8, 0); /* rseq_cs */
    if (errno || !cs)
        return false;
    errno = 0;
    long start = ptrace(PTRACE_PEEKDATA, tid, cs + 8, 0);
    long post = ptrace(PTRACE_PEEKDATA, tid, cs + 16, 0);
    if (errno)
        return true; /* unreadable descriptor: do not risk it */
    return rip >= (uint64_t)start && rip - (uint64_t)start < (uint64_t)post;
}

/* True when @tid has @headroom bytes of stack below @rsp. */
static bool wake_stack_ok(pid_t pid, uint64_t rsp, uint32_t headroom)
{
    HP_CLEANUP_FREE char *maps = svc__proc_maps(pid);
    struct wake_map m;
    if (!maps || !wake_map_of(maps, rsp - WAKE_RED_ZONE - 64, &m))
        return false;
    if (m.path_len >= 7 && strncmp(m.path, "[stack]", 7) == 0)
        return true; /* grows on demand */
    return rsp - m.start >= (uint64_t)headroom + WAKE_RED_ZONE;
}

/* Puts @regs back in stopped @tid (its call restarted when @restart) and detaches. */
static void wake_release(struct wake_ctx *c, pid_t tid, struct user_regs_struct regs, bool restart,
                         bool in_signal_stop)
{
    if (restart) {
        regs.rax = regs.orig_rax;
        regs.rip -= 2;
        regs.orig_rax = (unsigned long long)-1;
    }
    (void)ptrace(PTRACE_SETREGS, tid, 0, &regs);
    wake_detach(c, tid, in_signal_stop);
}

/* One call of @fn(@a0, @a1, @a2) on the taken thread, returning to the plan's trap: its
 * result in @ret. The frame lies below c->scratch. Returns 0, -ESRCH (the process ended),
 * or -EIO (the call faulted or hung: the thread is stopped again, reason in c->why). */
static int wake_remote_call(struct wake_ctx *c, uint64_t fn, uint64_t a0, uint64_t a1, uint64_t a2,
                            uint64_t *ret)
{
    pid_t tid = c->tid;
    uint64_t trap = c->plan->trap;
    /* Below the data, 16-byte aligned, the trap as the return address (so rsp is 8 mod 16
     * at the entry, as after a call). */
    uint64_t sp = (c->scratch & ~15ull) - 8;
    struct user_regs_struct call = c->base;
    call.rsp = sp;
    call.rip = fn;
    call.rdi = a0;
    call.rsi = a1;
    call.rdx = a2;
    call.rax = 0;
    call.orig_rax = (unsigned long long)-1; /* no restart logic on our registers */
    call.eflags &= ~X86_DF;
    if (ptrace(PTRACE_POKEDATA, tid, sp, (void *)trap) < 0 ||
        ptrace(PTRACE_SETREGS, tid, 0, &call) < 0 || ptrace(PTRACE_CONT, tid, 0, 0) < 0)
        return svc__why(c->why, c->why_len, -EIO, "cannot set up the call on thread %d: %s",
                        (int)tid, strerror(errno));

    for (;;) {
        int st;
        int w = wake_wait(tid, WAKE_CALL_NS, &st);
        if (w < 0 || (w > 0 && !WIFSTOPPED(st)))
            return -ESRCH; /* the process ended (not by our call: it blocks no exit) */
        if (w == 0) {
            /* The call hangs: take the thread back wherever it is. */
            (void)ptrace(PTRACE_INTERRUPT, tid, 0, 0);
            if (wake_wait_interrupt(c, tid) == -ESRCH)
                return -ESRCH;
            c->in_signal_stop = false;
            return svc__why(c->why, c->why_len, -EIO,
                            "the call on thread %d did not return within %llu s", (int)tid,
                            (unsigned long long)(WAKE_CALL_NS / 1000000000u));
        }
        int event = st >> 16, sig = WSTOPSIG(st);
        if (event != 0) { /* a group stop or another event: the call goes on */
            if (ptrace(PTRACE_CONT, tid, 0, 0) < 0)
                return -ESRCH;
            continue;
        }
        struct user_regs_struct now;
        siginfo_t si;
        memset(&si, 0, sizeof(si));
        if (ptrace(PTRACE_GETREGS, tid, 0, &now) < 0 || ptrace(PTRACE_GETSIGINFO, tid, 0, &si) < 0)
            return -ESRCH;
        if (sig == SIGTRAP && now.rip == trap + 1 && si.si_code > 0) {
            c->in_signal_stop = true;
            *ret = now.rax;
            return 0;
        }
        bool fault = si.si_code > 0 && (sig == SIGSEGV || sig == SIGBUS || sig == SIGILL ||
                                        sig == SIGFPE || sig == SIGSYS || sig == SIGTRAP);
        if (fault) {
            /* Ours: suppressed, the thread put back. */
            c->in_signal_stop = true;
            return svc__why(c->why, c->why_len, -EIO,
                            "the call faulted on thread %d (signal %d at %#llx); the thread "
                            "was put back",
                            (int)tid, sig, (unsigned long long)now.rip);
        }
        wake_keep_signal(c, tid, sig);
        if (ptrace(PTRACE_CONT, tid, 0, 0) < 0)
            return -ESRCH;
    }
}

int svc__rcall_call(struct svc_rcall *t, uint64_t fn, uint64_t a0, uint64_t a1, uint64_t a2,
                    uint64_t *ret)
{
    return wake_remote_call((struct wake_ctx *)t, fn, a0, a1, a2, ret);
}

int svc__rcall_put(struct svc_rcall *t, const void *data, size_t len, uint64_t *addr)
{
    struct wake_ctx *c = (struct wake_ctx *)t;
    uint64_t at = (c->scratch - len) & ~15ull;
    if (c->base.rsp - at + 256 > c->plan->headroom)
        return svc__why(c->why, c->why_len, -ENOSPC, "no stack left for the call's data");
    struct iovec local = {(void *)data, len}, remote = {(void *)(uintptr_t)at, len};
    if (process_vm_writev(c->pid, &local, 1, &remote, 1, 0) != (ssize_t)len)
        return svc__why(c->why, c->why_len, -EIO, "cannot write to thread %d's stack: %s",
                        (int)c->tid, strerror(errno));
    c->scratch = at;
    *addr = at;
    return 0;
}

int svc__rcall_read(struct svc_rcall *t, uint64_t addr, void *buf, size_t len)
{
    struct wake_ctx *c = (struct wake_ctx *)t;
    struct iovec local = {buf, len}, remote = {(void *)(uintptr_t)addr, len};
    return process_vm_readv(c->pid, &local, 1, &remote, 1, 0) == (ssize_t)len ? 0 : -EIO;
}

int svc__rcall_write(struct svc_rcall *t, uint64_t addr, const void *buf, size_t len)
{
    struct wake_ctx *c = (struct wake_ctx *)t;
    struct iovec local = {(void *)buf, len}, remote = {(void *)(uintptr_t)addr, len};
    return process_vm_writev(c->pid, &local, 1, &remote, 1, 0) == (ssize_t)len ? 0 : -EIO;
}

/* The wake's work: the entry, with our pid and the socket path (copied below the frame:
 * the entry copies it before it returns). */
static int wake_act_entry(struct svc_rcall *t, void *arg)
{
    struct wake_ctx *c = (struct wake_ctx *)t;
    (void)arg;
    uint64_t rax = 0, path_at = 0;
    int r = 0;
    if (c->sock_path)
        r = svc__rcall_put(t, c->sock_path, strlen(c->sock_path) + 1, &path_at);
    if (r == 0)
        r = wake_remote_call(c, c->page.entry, (uint64_t)c->attacher, path_at, 0, &rax);
    if (r == 0)
        c->answer = (int)rax;
    return r;
}

/* The plan's work on stopped @tid, between a save and an exact restore of its state.
 * Returns 0 (done, detached), -EAGAIN (not at a safe point: released, try later), -ESRCH
 * (gone), or another negative errno (the work failed: released unharmed, reason in
 * c->why). */
static int wake_call(struct wake_ctx *c, pid_t tid)
{
    struct user_regs_struct regs;
    if (ptrace(PTRACE_GETREGS, tid, 0, &regs) < 0)
        return -ESRCH;
    /* Did our stop end its call with EINTR? Then it is restarted exactly when we let it
     * go, whatever happens next. Decided now, before anything of ours can be pending. */
    bool restart = svc_wake_restart((long long)regs.orig_rax, (long long)regs.rax,
                                    wake_signal_pending(c->pid, tid));
    if (restart) {
        errno = 0;
        long insn = ptrace(PTRACE_PEEKTEXT, tid, regs.rip - 2, 0);
        if (errno || (insn & 0xffff) != 0x050f)
            restart = false; /* not after a syscall instruction (int 0x80?): cannot */
    }
    if ((long long)regs.orig_rax < 0 && wake_in_rseq(tid, regs.rip)) {
        wake_release(c, tid, regs, restart, false);
        return -EAGAIN;
    }
    if (!wake_stack_ok(c->pid, regs.rsp, c->plan->headroom) ||
        (c->plan->safe && !c->plan->safe(c->plan->arg, tid, regs.rip, regs.rsp))) {
        wake_release(c, tid, regs, restart, false);
        return -EAGAIN;
    }
    HP_CLEANUP_FREE uint8_t *xstate = malloc(WAKE_XSTATE_MAX);
    struct iovec xv = {xstate, WAKE_XSTATE_MAX};
    uint64_t mask = 0;
    if (!xstate || ptrace(PTRACE_GETREGSET, tid, NT_X86_XSTATE, &xv) < 0 ||
        ptrace(PTRACE_GETSIGMASK, tid, sizeof(mask), &mask) < 0) {
        wake_release(c, tid, regs, restart, false);
        return svc__why(c->why, c->why_len, -EIO, "cannot read the state of thread %d: %s",
                        (int)tid, strerror(errno ? errno : ENOMEM));
    }

    uint64_t all_but_trap = ~0ull & ~(1ull << (SIGTRAP - 1));
    c->tid = tid;
    c->base = regs;
    c->scratch = regs.rsp - WAKE_RED_ZONE;
    c->in_signal_stop = false;
    int r;
    if (ptrace(PTRACE_SETSIGMASK, tid, sizeof(all_but_trap), &all_but_trap) < 0)
        r = svc__why(c->why, c->why_len, -EIO, "cannot set up the call on thread %d: %s", (int)tid,
                     strerror(errno));
    else
        r = c->plan->act((struct svc_rcall *)c, c->plan->arg);
    if (r == -ESRCH)
        return -ESRCH;
    if (r == -EAGAIN)
        r = -EIO; /* the work began: never retried on another thread */

    (void)ptrace(PTRACE_SETREGSET, tid, NT_X86_XSTATE, &xv);
    (void)ptrace(PTRACE_SETSIGMASK, tid, sizeof(mask), &mask);
    if (r == 0)
        c->woken_tid = tid;
    wake_release(c, tid, regs, restart, c->in_signal_stop);
    return r;
}

/* Seizes and stops @tid, then calls. Returns as wake_call(), or -EPERM after a message. */
static int wake_thread(struct wake_ctx *c, pid_t tid)
{
    if (ptrace(PTRACE_SEIZE, tid, 0, 0) < 0) {
        int e = errno;
        if (e == ESRCH)
            return -ESRCH;
        if (e == EPERM || e == EACCES) {
            char path[64], st[8192], v[32];
            snprintf(path, sizeof(path), "/proc/%d/status", (int)c->pid);
            if (wake_read(path, st, sizeof(st)) > 0 &&
                wake_status_field(st, "TracerPid:", v, sizeof(v)) && atoi(v) != 0)
                return svc__why(c->why, c->why_len, -EBUSY, "is being traced by pid %s", v);
            return svc__wake_no_permission(e, c->why, c->why_len);
        }
        return svc__why(c->why, c->why_len, -e, "cannot trace thread %d: %s", (int)tid,
                        strerror(e));
    }
    c->stop_start_ns = hp_clock_ns(CLOCK_MONOTONIC);
    if (ptrace(PTRACE_INTERRUPT, tid, 0, 0) < 0)
        return -ESRCH;
    int r = wake_wait_interrupt(c, tid);
    if (r == -EBUSY) {
        wake_detach(c, tid, false);
        return svc__why(c->why, c->why_len, -EBUSY, "was stopped (by a signal) meanwhile");
    }
    if (r < 0)
        return r;
    r = wake_call(c, tid);
    if (r == 0)
        c->stop_ns = hp_clock_ns(CLOCK_MONOTONIC) - c->stop_start_ns;
    return r;
}

/* ---- the process ---------------------------------------------------------------------- */

struct wake_cand {
    pid_t tid;
    enum svc_wake_look look;
};

static int wake_cand_cmp(const void *a, const void *b)
{
    static const int rank[] = {[SVC_WAKE_IDLE] = 0,
                               [SVC_WAKE_IDLE_EINTR] = 1,
                               [SVC_WAKE_RUNNING] = 2,
                               [SVC_WAKE_LATER] = 3,
                               [SVC_WAKE_SKIP] = 4};
    const struct wake_cand *x = a, *y = b;
    return rank[x->look] - rank[y->look];
}

/* A look at thread @tid of @pid (SVC_WAKE_SKIP when it is gone). */
static enum svc_wake_look wake_look_tid(pid_t pid, pid_t tid)
{
    char path[96], text[512];
    snprintf(path, sizeof(path), "/proc/%d/task/%d/stat", (int)pid, (int)tid);
    if (wake_read(path, text, sizeof(text)) < 0)
        return SVC_WAKE_SKIP;
    const char *p = strrchr(text, ')');
    char state = p && p[1] == ' ' ? p[2] : '?';
    snprintf(path, sizeof(path), "/proc/%d/task/%d/syscall", (int)pid, (int)tid);
    if (wake_read(path, text, sizeof(text)) < 0)
        return SVC_WAKE_SKIP;
    return svc_wake_look(state, text);
}

/* Looks at every thread of @pid: up to @cap in @ret, best first. Returns the count. */
static size_t wake_candidates(pid_t pid, struct wake_cand *ret, size_t cap)
{
    char path[64];
    snprintf(path, sizeof(path), "/proc/%d/task", (int)pid);
    DIR *d = opendir(path);
    if (!d)
        return 0;
    size_t n = 0;
    struct dirent *e;
    while (n < cap && (e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.')
            continue;
        pid_t tid = (pid_t)atoi(e->d_name);
        enum svc_wake_look look = wake_look_tid(pid, tid);
        if (look != SVC_WAKE_SKIP)
            ret[n++] = (struct wake_cand){tid, look};
    }
    closedir(d);
    qsort(ret, n, sizeof(*ret), wake_cand_cmp);
    return n;
}

/* Every thread waits with a timeout a stop would cut short: watches them closely for
 * @ns (they run for microseconds between two waits) and takes the first seen running
 * or in another call. Returns as wake_thread(), or -EAGAIN when none was seen. */
static int wake_watch_later(struct wake_ctx *c, const struct wake_cand *cands, size_t n,
                            uint64_t ns)
{
    uint64_t end = hp_clock_ns(CLOCK_MONOTONIC) + ns;
    while (hp_clock_ns(CLOCK_MONOTONIC) < end) {
        for (size_t i = 0; i < n; i++) {
            enum svc_wake_look l = wake_look_tid(c->pid, cands[i].tid);
            if (l == SVC_WAKE_SKIP || l == SVC_WAKE_LATER)
                continue;
            int r = wake_thread(c, cands[i].tid);
            if (r != -EAGAIN && r != -ESRCH)
                return r;
        }
    }
    return -EAGAIN;
}

/* The advertisement page of @p, checked: its addresses lie in executable mappings of
 * libheapprof.so. */
static int wake_read_page(const struct svc_proc *p, struct hp_wake_page *ret, char *why, size_t len)
{
    struct hp_wake_page pg;
    struct iovec local = {&pg, sizeof(pg)}, remote = {(void *)(uintptr_t)p->wake_page, sizeof(pg)};
    ssize_t n = process_vm_readv(p->pid, &local, 1, &remote, 1, 0);
    if (n < 0 && (errno == EPERM || errno == EACCES))
        return svc__wake_no_permission(errno, why, len);
    if (n < 0)
        return errno == ESRCH
                   ? -ESRCH
                   : svc__why(why, len, -errno, "cannot read its wake page: %s", strerror(errno));
    if (n != (ssize_t)sizeof(pg) || pg.magic != HP_WAKE_MAGIC || pg.version != HP_WAKE_VERSION ||
        pg.size < HP_WAKE_PAGE_MIN_SIZE)
        return svc__why(why, len, -EPROTO,
                        "its libheapprof.so advertises no wake entry this heapprof knows "
                        "(another version?)");
    HP_CLEANUP_FREE char *maps = svc__proc_maps(p->pid);
    struct wake_map e, t;
    if (!maps || !wake_map_of(maps, pg.entry, &e) || !wake_map_of(maps, pg.trap, &t) ||
        e.perms[2] != 'x' || t.perms[2] != 'x' || !wake_map_path_ends(&e, "/libheapprof.so") ||
        !wake_map_path_ends(&t, "/libheapprof.so"))
        return svc__why(why, len, -EPROTO,
                        "its wake page does not point into libheapprof.so's code");
    if (pg.size < sizeof(pg))
        pg.features = 0; /* an older client's page: what follows is not ours */
    *ret = pg;
    return 0;
}

/* What the entry answered (@answer, HP_WAKE_*): 0 when its session thread is on its way,
 * else the refusal with its reason. */
static int wake_answer(int answer, char *why, size_t len)
{
    struct svc_proc by;
    switch (answer) {
    case HP_WAKE_STARTED:
        return 0;
    case HP_WAKE_PROFILED:
        return svc__why(why, len, -EALREADY,
                        "is already being profiled (by heapprof record, another heapprof attach "
                        "or heapprofd); a process is in one session at a time");
    case HP_WAKE_BUSY:
        return svc__why(why, len, -EALREADY,
                        "is being attached by another session right now; try again once it is "
                        "over");
    case HP_WAKE_NOT_OWNER:
        return svc__why(why, len, -EIO, "is a vfork child of a profiled program, about to exec");
    default:
        if (answer <= 0)
            return svc__why(why, len, -EIO,
                            "could not start its profiling session (no thread: out of memory?)");
        if (answer == getpid())
            return svc__why(why, len, -EALREADY, "is already being profiled by this session");
        return svc__why(why, len, -EALREADY,
                        "is already being profiled by pid %d (%s); a process is in one session "
                        "at a time: end that one first",
                        answer, svc_proc_inspect(answer, &by) == 0 ? by.name : "gone since");
    }
}

/* Takes one thread of c->pid after another, best first, until the plan's work was done
 * on one (0), failed (its error), or no thread could be taken within @choose_ns. */
static int wake_choose(struct wake_ctx *c, uint64_t choose_ns)
{
    /* A tracer that dies during a call leaves the thread to run into the trap. */
    sigset_t stop, old;
    sigemptyset(&stop);
    sigaddset(&stop, SIGINT);
    sigaddset(&stop, SIGTERM);
    sigaddset(&stop, SIGHUP);
    sigaddset(&stop, SIGQUIT);
    pthread_sigmask(SIG_BLOCK, &stop, &old);

    uint64_t end = hp_clock_ns(CLOCK_MONOTONIC) + choose_ns;
    struct wake_cand cands[256];
    int r = -EAGAIN;
    bool saw_later = false;
    long nap = 1000;
    while (r == -EAGAIN || r == -ESRCH) {
        size_t n = wake_candidates(c->pid, cands, HP_ARRAY_SIZE(cands));
        if (n == 0 && kill(c->pid, 0) < 0 && errno == ESRCH) {
            r = svc__why(c->why, c->why_len, -ESRCH, "exited");
            break;
        }
        r = -EAGAIN;
        size_t i = 0;
        for (; i < n && cands[i].look != SVC_WAKE_LATER && (r == -EAGAIN || r == -ESRCH); i++)
            r = wake_thread(c, cands[i].tid);
        if (r != -EAGAIN && r != -ESRCH)
            break;
        if (i < n && cands[i].look == SVC_WAKE_LATER) {
            saw_later = true;
            r = wake_watch_later(c, cands + i, n - i, 50000000u);
            if (r != -EAGAIN && r != -ESRCH)
                break;
        }
        if (hp_clock_ns(CLOCK_MONOTONIC) >= end) {
            r = svc__why(c->why, c->why_len, -ETIMEDOUT,
                         "no thread could be taken safely within %llu s (%s)",
                         (unsigned long long)(choose_ns / 1000000000u),
                         saw_later ? "they wait with a timeout that a stop would cut short"
                         : c->plan->safe
                             ? "each was in D state, inside an rseq section, short of "
                               "stack, or inside the allocator, the loader, fork or exit"
                             : "in D state, inside an rseq section, or short of stack");
            break;
        }
        /* Threads found unsafe are often busy allocating: look again soon, then less often. */
        wake_sleep_us(nap);
        nap = HP_MIN(nap * 2, 20000);
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    return r;
}

int svc__rcall_preflight(pid_t pid, char *why, size_t len)
{
    return wake_preflight(pid, why, len);
}

int svc__rcall_run(pid_t pid, const struct svc_rcall_plan *plan, char *why, size_t why_len,
                   struct svc_rcall_stats *stats)
{
    struct wake_ctx c = {.pid = pid, .plan = plan, .why = why, .why_len = why_len};
    uint64_t start = hp_clock_ns(CLOCK_MONOTONIC);
    int r = wake_choose(&c, plan->choose_ns);
    if (stats)
        *stats = (struct svc_rcall_stats){.tid = c.woken_tid,
                                          .stop_ns = r == 0 ? c.stop_ns : 0,
                                          .total_ns = hp_clock_ns(CLOCK_MONOTONIC) - start};
    return r;
}

int svc_proc_wake(const struct svc_proc *p, pid_t attacher, char *why, size_t why_len)
{
    return svc_proc_wake_to(p, attacher, NULL, why, why_len);
}

int svc_proc_wake_to(const struct svc_proc *p, pid_t attacher, const char *sock_path, char *why,
                     size_t why_len)
{
    if (why && why_len)
        why[0] = '\0';
    if (!p->attach_ready)
        return -EAGAIN;
    /* The pidfd pins the process we check next: if it dies and its pid is reused, the
     * check sees another start time (ptrace and /proc then fail on the old one). */
    HP_CLEANUP_CLOSE int pidfd = (int)syscall(SYS_pidfd_open, p->pid, 0);
    if (pidfd < 0 && errno != ENOSYS)
        return errno == ESRCH ? svc__why(why, why_len, -ESRCH, "exited") : -errno;
    struct svc_proc now;
    int r = svc_proc_inspect(p->pid, &now);
    if (r < 0 || now.start_time != p->start_time)
        return svc__why(why, why_len, -ESRCH, "exited");
    if (!now.attach_ready)
        return -EAGAIN;
    r = wake_preflight(p->pid, why, why_len);
    if (r < 0)
        return r;
    struct wake_ctx c = {.pid = p->pid,
                         .attacher = attacher,
                         .sock_path = sock_path,
                         .why = why,
                         .why_len = why_len};
    r = wake_read_page(&now, &c.page, why, why_len);
    if (r < 0)
        return r;
    if (sock_path &&
        (!(c.page.features & HP_WAKE_FEATURE_PATH) || strlen(sock_path) >= HP_WAKE_PATH_MAX))
        return svc__why(why, why_len, -EPROTO,
                        "lives in other namespaces (a container) and its libheapprof.so is of a "
                        "version that cannot be told where to connect from there: restart it "
                        "with this version's library, or attach from inside");
    struct svc_rcall_plan plan = {
        .trap = c.page.trap, .headroom = WAKE_HEADROOM, .act = wake_act_entry};
    c.plan = &plan;

    uint64_t start = hp_clock_ns(CLOCK_MONOTONIC);
    r = wake_choose(&c, WAKE_CHOOSE_NS);
    if (r == 0)
        r = wake_answer(c.answer, why, why_len);
    if (r == 0) /* the start time is what scripts/bench.sh's attach group measures from */
        hp_log_debug("pid %d: woken on thread %d in %.3f ms (started at %llu ns monotonic)",
                     (int)p->pid, (int)c.woken_tid,
                     (double)(hp_clock_ns(CLOCK_MONOTONIC) - start) / 1e6,
                     (unsigned long long)start);
    return r;
}
