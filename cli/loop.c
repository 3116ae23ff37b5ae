/* cli/loop.c: see loop.h. */
#include "cli/loop.h"

#include <errno.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/format.h"
#include "common/log.h"

static sigset_t loop_signals(void)
{
    sigset_t m;
    sigemptyset(&m);
    sigaddset(&m, SIGINT);
    sigaddset(&m, SIGTERM);
    sigaddset(&m, SIGHUP);
    sigaddset(&m, SIGQUIT);
    sigaddset(&m, SIGUSR1);
    sigaddset(&m, SIGCHLD);
    return m;
}

/* The sigprocmask() called here and below is the one unwinder/sigmask.c defines for the
 * whole executable, to keep libunwind's mask syscalls off the unwinding path. That is
 * harmless here: it does nothing only on a thread whose thread-local
 * unwinder__sigmask_skip is set, which an unwinder thread does for the time it runs
 * unwinder_unwind(); on every other thread (the main thread that calls this is one) it
 * forwards to libc's. */
void cli_loop_block_signals(sigset_t *ret_old)
{
    sigset_t m = loop_signals();
    sigprocmask(SIG_BLOCK, &m, ret_old);
}

/* "1:05" or "1:02:05". */
static const char *fmt_duration(uint64_t ns, char *buf, size_t len)
{
    uint64_t s = ns / 1000000000u;
    if (s >= 3600)
        snprintf(buf, len, "%llu:%02llu:%02llu", (unsigned long long)(s / 3600),
                 (unsigned long long)(s / 60 % 60), (unsigned long long)(s % 60));
    else
        snprintf(buf, len, "%llu:%02llu", (unsigned long long)(s / 60),
                 (unsigned long long)(s % 60));
    return buf;
}

static void draw_status(svc_t *s, uint64_t start, uint64_t duration_ms, uint64_t *last_samples,
                        uint64_t *last_ns, bool final)
{
    struct svc_status st;
    svc_get_status(s, &st);
    uint64_t now = hp_clock_ns(CLOCK_MONOTONIC);
    /* The rate since the last line; the last line's comes right after another one (0
     * samples/s, as it showed), so it gives the mean over the whole run. */
    double secs = (double)(now - (final ? start : *last_ns)) / 1e9;
    double rate = secs > 0 ? (double)(st.samples - (final ? 0 : *last_samples)) / secs : 0;
    *last_samples = st.samples;
    *last_ns = now;
    char out[32], live[32], el[32], left[32] = "";
    hp_format_bytes(st.output_bytes, out, sizeof(out));
    hp_format_bytes(st.live_bytes, live, sizeof(live));
    fmt_duration(now - start, el, sizeof(el));
    uint64_t end = start + duration_ms * 1000000u;
    if (duration_ms && end > now) {
        char d[24];
        snprintf(left, sizeof(left), " (%s left)",
                 fmt_duration(end - now + 999999999u, d, sizeof(d)));
    }
    fprintf(stderr,
            "\r\033[Kheapprof: %s%s, %u process%s, live heap %s, %.0f samples/s, %llu dropped, "
            "%llu dump%s, %s written",
            el, left, st.live_processes, st.live_processes == 1 ? "" : "es", live, rate,
            (unsigned long long)st.records_dropped, (unsigned long long)st.dumps,
            st.dumps == 1 ? "" : "s", out);
    if (final)
        fputc('\n', stderr);
    fflush(stderr);
}

/* Takes the pending signals from @sfd: reaps children (noting the exit of o->child at
 * @exit_ns), dumps on SIGUSR1, passes a stop signal on to a running child, and otherwise
 * stores the stop signal in ret->signo. */
static void take_signals(int sfd, svc_t *s, const struct cli_loop_opts *o,
                         struct cli_loop_result *ret, uint64_t *exit_ns)
{
    struct signalfd_siginfo si;
    while (read(sfd, &si, sizeof(si)) == (ssize_t)sizeof(si)) {
        int sig = (int)si.ssi_signo;
        if (sig == SIGCHLD) {
            pid_t w;
            int st;
            while ((w = waitpid(-1, &st, WNOHANG)) > 0) {
                if (o->child > 0 && w == o->child) {
                    ret->child_status = st;
                    ret->child_exited = true;
                    *exit_ns = hp_clock_ns(CLOCK_MONOTONIC);
                }
            }
        } else if (sig == SIGUSR1) {
            if (svc_dump_now(s) < 0)
                hp_log_warn("cannot schedule a dump");
        } else if (o->child > 0 && !ret->child_exited) {
            /* The terminal signals the whole process group (the child too); a signal
             * from another process is passed on. */
            if (o->forward_signals && si.ssi_pid != 0)
                (void)kill(o->child, sig);
        } else {
            ret->signo = sig;
        }
    }
}

/* A continuous dump, due at @due: asks for it and returns when the next one is due
 * (one interval on, or from @now if the loop fell behind). */
static uint64_t dump_on_schedule(svc_t *s, const struct cli_loop_opts *o, uint64_t due,
                                 uint64_t now)
{
    if (svc_dump_now(s) < 0)
        hp_log_warn("cannot schedule a dump");
    uint64_t next = due + (uint64_t)o->dump_interval_ms * 1000000u;
    if (next < now)
        next = now + (uint64_t)o->dump_interval_ms * 1000000u;
    return next;
}

int cli_loop_run(svc_t *s, const struct cli_loop_opts *o, struct cli_loop_result *ret)
{
    memset(ret, 0, sizeof(*ret));
    sigset_t m = loop_signals();
    int sfd = signalfd(-1, &m, SFD_CLOEXEC | SFD_NONBLOCK);
    if (sfd < 0)
        return -errno;
    /* Signals (the child's exit above all) wake the poll at once. */
    if (svc_watch_fd(s, sfd) < 0)
        hp_log_debug("signals are polled, not watched");

    uint64_t start = hp_clock_ns(CLOCK_MONOTONIC);
    uint64_t next_dump =
        o->dump_interval_ms ? start + (uint64_t)o->dump_phase_ms * 1000000u : UINT64_MAX;
    uint64_t next_tick = start, next_status = start + 1000000000u;
    uint64_t exit_ns = 0, last_samples = 0, last_status_ns = start;
    bool had_clients = false, said_exit = false;
    /* HEAPPROF_TEST_EXIT_PAUSE_MS: once the child exited, a pause between the look at
     * the live sessions and the look at the child's end, for the tests of the message
     * said then (sessions end in between). Read once: nothing in the loop sets it. */
    const char *pause_env = getenv("HEAPPROF_TEST_EXIT_PAUSE_MS");
    long exit_pause_ms = pause_env ? atol(pause_env) : 0;
    unsigned ending = 0; /* sessions whose last records were being read, last look */
    int r = 0;

    for (;;) {
        /* Once the child has exited, its clients' ends are checked every few ms while
         * any is ending (descendants still running may run for long: then every 50). */
        r = svc_poll(s, ret->child_exited && (!said_exit || ending > 0) ? 2 : 50);
        if (r < 0)
            hp_log_warn("accepting clients: %s", strerror(-r));
        r = 0;

        take_signals(sfd, s, o, ret, &exit_ns);
        if (ret->signo)
            break;

        uint64_t now = hp_clock_ns(CLOCK_MONOTONIC);
        if (now >= next_dump)
            next_dump = dump_on_schedule(s, o, next_dump, now);
        if (now >= next_tick) {
            next_tick = now + 100000000u;
            (void)svc_check_guardrails(s);
            if (o->tick && o->tick(o->tick_ctx, s))
                break;
        }
        if (o->status_line && now >= next_status) {
            draw_status(s, start, o->duration_ms, &last_samples, &last_status_ns, false);
            next_status = now + 1000000000u;
        }
        if (o->duration_ms && now - start >= o->duration_ms * 1000000u) {
            ret->duration_elapsed = true;
            break;
        }
        unsigned live = svc_live_clients(s);
        had_clients |= live > 0;
        if (exit_pause_ms > 0 && ret->child_exited)
            (void)usleep((useconds_t)exit_pause_ms * 1000u);
        if (o->stop_when_no_clients && had_clients && live == 0)
            break;
        if (ret->child_exited && o->follow_descendants) {
            /* Its own session ended (or a moment passed): what remains is descendants.
             * The child's end is read before the counts, so that they count its session
             * as ending or gone: read after, a session that ended in between (the
             * child's own, which is all there is after a short command) was taken for a
             * descendant still running. */
            bool own_ended = !svc_client_seen(s, o->child) || svc_client_ended(s, o->child);
            struct svc_status st;
            svc_get_status(s, &st);
            ending = st.ending_processes;
            if (live == 0)
                break;
            unsigned running = st.live_processes > st.ending_processes
                                   ? st.live_processes - st.ending_processes
                                   : 0;
            /* Said once the child's own session began to end (it counted as running
             * until the service saw it end, a moment after the exit) while others run,
             * or after 2 s. Sessions that are all ending say nothing: the loop ends with
             * them. */
            bool long_ago = now - exit_ns > 2000000000ull;
            if (!said_exit && ((own_ended && running > 0) || long_ago)) {
                said_exit = true;
                if (o->child_exited)
                    o->child_exited(o->tick_ctx, running);
            }
        } else if (ret->child_exited) {
            /* Let every client that exited with the program be drained; descendants
             * still running after a grace period are dumped as they are. Sessions whose
             * last records are being read are waited for (each has a deadline). */
            struct svc_status st;
            svc_get_status(s, &st);
            if (live == 0 || (now - exit_ns > 2000000000ull && st.ending_processes == 0))
                break;
        }
    }
    if (o->status_line)
        draw_status(s, start, o->duration_ms, &last_samples, &last_status_ns, true);
    svc_unwatch_fd(s, sfd);
    (void)close(sfd);
    return r;
}

static int emergency_fd = -1;
static svc_t *emergency_svc;

static void second_interrupt(int sig)
{
    (void)sig;
    if (emergency_fd >= 0 && emergency_svc) {
        struct svc_status st;
        svc_get_status(emergency_svc, &st); /* relaxed atomic loads only */
        (void)!ftruncate(emergency_fd, (off_t)st.output_bytes);
    }
    static const char msg[] = "\nheapprof: interrupted again; trace cut at its last complete "
                              "packet\n";
    (void)!write(STDERR_FILENO, msg, sizeof(msg) - 1);
    _exit(130);
}

void cli_loop_arm_second_interrupt(int out_fd, svc_t *s)
{
    emergency_fd = out_fd;
    emergency_svc = s;
    struct sigaction sa = {.sa_handler = second_interrupt};
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigset_t m;
    sigemptyset(&m);
    sigaddset(&m, SIGINT);
    sigaddset(&m, SIGTERM);
    /* libc's, not skipped: see cli_loop_block_signals(). */
    sigprocmask(SIG_UNBLOCK, &m, NULL);
}
