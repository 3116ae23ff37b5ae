/* cli/session.c: the one session runner of `heapprof record`, `heapprof attach` and
 * heapprofd: open the output, start the service, run the loop, dump, and summarise. */
#include "cli/cli.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <string.h>
#include <unistd.h>

#include "common/log.h"
#include "common/paths.h"

/* The socket @cfg has the service listen on, for a message: svc_new() does not say which
 * one was taken, and -EADDRINUSE is ours to report. */
static const char *socket_of(const struct svc_config *cfg, char *buf, size_t len)
{
    if (cfg->socket_path)
        return cfg->socket_path;
    if (!cfg->socket_dir)
        return "that socket"; /* a private directory of its own: not expected */
    snprintf(buf, len, "%s/" HP_DAEMON_SOCKET_NAME, cfg->socket_dir);
    return buf;
}

int cli_session_run(const struct cli_session *cs, struct cli_loop_result *ret_res)
{
    memset(ret_res, 0, sizeof(*ret_res));
    char output[PATH_MAX], err[PATH_MAX + 160];
    int out_fd =
        cli_output_open(cs->output, cs->output_made_up, output, sizeof(output), err, sizeof(err));
    if (out_fd < 0) {
        fprintf(stderr, "%s: %s\n", cs->prog, err);
        return EXIT_PROFILER;
    }
    if (cs->output_opened)
        memcpy(cs->output_opened, output, strlen(output) + 1);
    /* Signals are taken through a signalfd: blocked before any thread exists. */
    cli_loop_block_signals(NULL);
    svc_t *s = NULL;
    int r = svc_new(cs->cfg, out_fd, &s);
    if (r < 0) {
        char sock[PATH_MAX];
        fprintf(stderr, "%s: cannot start the profiling service: %s%s\n", cs->prog,
                r == -EADDRINUSE ? "another heapprofd is already running on " : strerror(-r),
                r == -EADDRINUSE ? socket_of(cs->cfg, sock, sizeof(sock)) : "");
        (void)close(out_fd);
        return EXIT_PROFILER;
    }
    struct cli_loop_opts lo = cs->loop;
    lo.dump_interval_ms = cs->cfg->dump_interval_ms;
    lo.dump_phase_ms = cs->cfg->dump_phase_ms;
    r = cs->started ? cs->started(cs->ctx, s) : 0;
    if (r >= 0) {
        r = cli_loop_run(s, &lo, ret_res);
        if (r < 0)
            hp_log_warn("%s", strerror(-r));
    }
    cli_loop_arm_second_interrupt(out_fd, s);
    if (cs->stopping)
        cs->stopping(cs->ctx, ret_res);

    struct svc_summary sum;
    r = svc_finish(s, &sum);
    svc_free(s);
    if (close(out_fd) < 0 && r == 0)
        r = -errno;
    if (r < 0) {
        fprintf(stderr, "%s: writing '%s' failed: %s\n", cs->prog, output, strerror(-r));
        return EXIT_PROFILER;
    }
    if (cs->ret_processes)
        *cs->ret_processes = sum.processes;
    if (cs->drop_if_empty && sum.processes == 0 && sum.handshakes_rejected == 0) {
        /* Nothing but a header: no file to mistake for a profile. */
        (void)unlink(output);
        fprintf(stderr, "%s: no process was profiled; no trace written\n", cs->prog);
        return 0;
    }
    if (!cs->quiet)
        cli_print_summary(output, &sum, cs->top);
    return 0;
}
