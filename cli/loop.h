/* cli/loop.h: the main-thread loop shared by `heapprof record`, `heapprof attach` and
 * `heapprofd`: accepts clients, takes signals through a signalfd, schedules continuous
 * dumps, checks guardrails, shows a status line on a terminal, and waits for a child.
 *
 *     struct cli_loop_opts o = {.dump_interval_ms = 1000, .status_line = isatty(2)};
 *     struct cli_loop_result res;
 *     cli_loop_block_signals();          // before any thread is created
 *     ... svc_new(...) ...
 *     cli_loop_run(s, &o, &res);
 *     cli_loop_arm_second_interrupt(out_fd, s);   // a second Ctrl-C exits at once
 *     svc_finish(s, &summary);
 */
#ifndef HP_CLI_LOOP_H
#define HP_CLI_LOOP_H

#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "service/svc.h"

struct cli_loop_opts {
    uint32_t dump_interval_ms; /* 0: no continuous dumps */
    uint32_t dump_phase_ms;    /* first dump this long after the start */
    uint64_t duration_ms;      /* 0: until a signal (or the child's exit) */
    bool status_line;          /* redraw a one-line status on stderr every second */
    pid_t child;               /* >0: wait for this child; its exit ends the loop */
    bool forward_signals;      /* SIGINT/SIGTERM sent by a process go to the child */
    bool stop_when_no_clients; /* end when every client that connected has gone */
    /* With @child: once it exited, go on while profiled processes remain (its descendants:
     * a program that daemonizes), until they end or a stop signal, and call
     * child_exited(tick_ctx, live) once when it exited with @live of them left. Without
     * it the loop ends a grace period after the child's exit. */
    bool follow_descendants;
    void (*child_exited)(void *ctx, unsigned live);
    /* Called every ~100 ms; returning true ends the loop. */
    bool (*tick)(void *ctx, svc_t *s);
    void *tick_ctx;
};

struct cli_loop_result {
    bool child_exited;
    int child_status; /* waitpid status */
    int signo;        /* the signal that ended the loop, or 0 */
    bool duration_elapsed;
};

/* Blocks the signals the loop takes (SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1,
 * SIGCHLD) in the calling thread, so threads created afterwards inherit the mask.
 * Stores the previous mask in @ret_old (for children). */
void cli_loop_block_signals(sigset_t *ret_old);

/* Runs until the child exits, a terminating signal, the duration, or tick() says so.
 * Returns 0 or -errno. */
int cli_loop_run(svc_t *s, const struct cli_loop_opts *o, struct cli_loop_result *ret);

/* From now on a SIGINT or SIGTERM truncates @out_fd to its last complete packet and
 * exits at once (status 130). */
void cli_loop_arm_second_interrupt(int out_fd, svc_t *s);

#endif
