/* cli/heapprofd.c: the heapprof daemon. Processes started with libheapprof.so
 * preloaded connect to its socket at startup; those matching the targets are profiled
 * from startup and dumped when they exit; running targets are woken by the attach
 * signal. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cli/cli.h"
#include "cli/loop.h"
#include "common/log.h"
#include "common/paths.h"

static void usage(FILE *f)
{
    fputs("usage: heapprofd [options]\n"
          "\n"
          "Runs the heapprof service in the foreground (logs on stderr). Processes started\n"
          "with LD_PRELOAD=.../libheapprof.so connect to it at startup; those matching the\n"
          "targets are profiled from their first allocation and dumped when they exit.\n"
          "Running targets that have the library are attached with a signal (unless\n"
          "--no-running). Stop with Ctrl-C or SIGTERM: every process is dumped and the\n"
          "trace completed; a second Ctrl-C exits at once. SIGUSR1 (or 'heapprof dump')\n"
          "dumps now.\n"
          "\n"
          "options (each is also a HeapprofdConfig field of the config file):\n"
          "      --config FILE            HeapprofdConfig in protobuf text format; flags given\n"
          "                               after it override it\n"
          "      --socket PATH            listen here (default <runtime dir>/heapprofd.sock,\n"
          "                               the runtime dir being $XDG_RUNTIME_DIR/heapprof or\n"
          "                               /tmp/heapprof-<uid>); clients: HEAPPROF_SOCKET\n"
          "  -o, --output FILE|DIR        trace file, or directory for a new one (default\n"
          "                               ./heapprofd-<date>-<pid>.pftrace)\n"
          "  -p, --pid PID                profile this process (repeatable)\n"
          "  -n, --process-cmdline NAME   processes whose argv[0], its basename, or a glob of\n"
          "                               either matches (repeatable)\n"
          "      --all                    profile every process that connects\n"
          "  -i, --sampling-interval N    sampling_interval_bytes (default 4096)\n"
          "      --continuous-dump MS[,PHASE_MS]  continuous_dump_config\n"
          "      --shmem-size N           shmem_size_bytes (default 8M)\n"
          "      --block-client           block_client\n"
          "      --block-timeout-us N     block_client_timeout_us\n"
          "      --dump-at-max            dump_at_max\n"
          "      --no-startup             no_startup: ignore processes connecting at startup\n"
          "      --no-running             no_running: do not signal running processes\n"
          "      --max-memory-kb N        max_heapprofd_memory_kb guardrail\n"
          "      --max-cpu-secs N         max_heapprofd_cpu_secs guardrail\n"
          "      --disable-fork-teardown  disable_fork_teardown\n"
          "      --no-status              no live status line (shown on a terminal)\n"
          "      --allow-other-users      as root, also profile other users' processes (the\n"
          "                               socket must then be reachable by them)\n"
          "      --no-fast-unwind         clients copy every sampled stack (by default they\n"
          "                               walk their own stacks with the unwind rules the\n"
          "                               service publishes for them)\n"
          "      --audit-every N          check every Nth stack a client thread walked\n"
          "                               against an unwind of its copy (default 1024;\n"
          "                               0: never)\n"
          "  -h, --help                   this help\n"
          "\n"
          "example:\n"
          "  heapprofd -n myapp --continuous-dump 1000 -o /tmp/traces &\n"
          "  LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libheapprof.so myapp\n"
          "\n"
          "exit status: 0 stopped cleanly; 2 usage or configuration error; 3 service failure.\n",
          f);
}

enum {
    OPT_CONFIG = 256,
    OPT_SOCKET,
    OPT_ALL,
    OPT_CONT,
    OPT_SHMEM,
    OPT_BLOCK,
    OPT_BLOCK_TIMEOUT,
    OPT_MAX,
    OPT_NO_STARTUP,
    OPT_NO_RUNNING,
    OPT_MEM,
    OPT_CPU,
    OPT_FORK,
    OPT_STATUS,
    OPT_OTHER_USERS,
    OPT_NO_STATUS,
    OPT_NO_FAST_UNWIND,
    OPT_AUDIT_EVERY,
};

static const struct option opts[] = {
    {"config", required_argument, NULL, OPT_CONFIG},
    {"socket", required_argument, NULL, OPT_SOCKET},
    {"output", required_argument, NULL, 'o'},
    {"pid", required_argument, NULL, 'p'},
    {"process-cmdline", required_argument, NULL, 'n'},
    {"all", no_argument, NULL, OPT_ALL},
    {"sampling-interval", required_argument, NULL, 'i'},
    {"continuous-dump", required_argument, NULL, OPT_CONT},
    {"shmem-size", required_argument, NULL, OPT_SHMEM},
    {"block-client", no_argument, NULL, OPT_BLOCK},
    {"block-timeout-us", required_argument, NULL, OPT_BLOCK_TIMEOUT},
    {"dump-at-max", no_argument, NULL, OPT_MAX},
    {"no-startup", no_argument, NULL, OPT_NO_STARTUP},
    {"no-running", no_argument, NULL, OPT_NO_RUNNING},
    {"max-memory-kb", required_argument, NULL, OPT_MEM},
    {"max-cpu-secs", required_argument, NULL, OPT_CPU},
    {"disable-fork-teardown", no_argument, NULL, OPT_FORK},
    {"status", no_argument, NULL, OPT_STATUS},
    {"no-status", no_argument, NULL, OPT_NO_STATUS},
    {"allow-other-users", no_argument, NULL, OPT_OTHER_USERS},
    {"no-fast-unwind", no_argument, NULL, OPT_NO_FAST_UNWIND},
    {"audit-every", required_argument, NULL, OPT_AUDIT_EVERY},
    {"help", no_argument, NULL, 'h'},
    {0},
};

static int bad(const char *what, const char *arg)
{
    fprintf(stderr, "heapprofd: invalid %s '%s'\n", what, arg);
    return EXIT_USAGE;
}

static int parse_u64(const char *s, uint64_t *ret)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || end == s || *end || s[0] == '-')
        return -EINVAL;
    *ret = v;
    return 0;
}

static void signal_running(void *ctx, const struct svc_proc *p)
{
    (void)ctx;
    int r = svc_proc_signal_attach(p->pid, 0);
    if (r < 0)
        hp_log_warn("pid %d (%s): cannot send the attach signal: %s", (int)p->pid, p->name,
                    strerror(-r));
    else
        hp_log_info("pid %d (%s): attach signal sent", (int)p->pid, p->name);
}

int cmd_daemon(int argc, char **argv, const char *prog)
{
    struct svc_config cfg;
    const char *output = NULL, *socket_path = NULL;
    bool status_line = true; /* on a terminal */
    char err[512];
    uint64_t v;
    int c, rc = 0, out_fd = -1;

    (void)prog;
    svc_config_init(&cfg);
    /* The config file first, so flags override it wherever they are. */
    opterr = 0;
    while ((c = getopt_long(argc, argv, "o:p:n:i:h", opts, NULL)) != -1) {
        if (c == OPT_CONFIG && svc_config_load_file(optarg, &cfg, err, sizeof(err)) < 0) {
            fprintf(stderr, "heapprofd: %s\n", err);
            rc = EXIT_USAGE;
            goto out;
        }
    }
    opterr = 1;
    optind = 0;
    while ((c = getopt_long(argc, argv, "o:p:n:i:h", opts, NULL)) != -1) {
        switch (c) {
        case OPT_CONFIG:
            break;
        case OPT_SOCKET:
            socket_path = optarg;
            break;
        case 'o':
            output = optarg;
            break;
        case 'p':
            if (parse_u64(optarg, &v) < 0 || v == 0 || v > INT32_MAX ||
                cfg.n_pid >= SVC_MAX_TARGETS) {
                rc = bad("pid", optarg);
                goto out;
            }
            cfg.pid[cfg.n_pid++] = (int32_t)v;
            break;
        case 'n':
            if (!*optarg || cfg.n_process_cmdline >= SVC_MAX_TARGETS) {
                rc = bad("process name", optarg);
                goto out;
            }
            cfg.process_cmdline[cfg.n_process_cmdline++] = strdup(optarg);
            break;
        case OPT_ALL:
            cfg.all = true;
            break;
        case 'i':
            if (svc_parse_bytes(optarg, &v) < 0) {
                rc = bad("sampling interval (bytes >= 1)", optarg);
                goto out;
            }
            cfg.sampling_interval_bytes = v;
            break;
        case OPT_CONT:
            if (parse_continuous_dump(optarg, &cfg) < 0) {
                rc = bad("--continuous-dump (INTERVAL_MS[,PHASE_MS], INTERVAL_MS >= 10)", optarg);
                goto out;
            }
            break;
        case OPT_SHMEM:
            if (svc_parse_bytes(optarg, &v) < 0) {
                rc = bad("--shmem-size", optarg);
                goto out;
            }
            cfg.shmem_size_bytes = v;
            break;
        case OPT_BLOCK:
            cfg.block_client = true;
            break;
        case OPT_BLOCK_TIMEOUT:
            if (parse_u64(optarg, &v) < 0 || v > 60000000) {
                rc = bad("--block-timeout-us", optarg);
                goto out;
            }
            cfg.block_client_timeout_us = (uint32_t)v;
            break;
        case OPT_MAX:
            cfg.dump_at_max = true;
            break;
        case OPT_NO_STARTUP:
            cfg.no_startup = true;
            break;
        case OPT_NO_RUNNING:
            cfg.no_running = true;
            break;
        case OPT_MEM:
            if (parse_u64(optarg, &v) < 0 || v == 0) {
                rc = bad("--max-memory-kb", optarg);
                goto out;
            }
            cfg.max_heapprofd_memory_kb = v;
            break;
        case OPT_CPU:
            if (parse_u64(optarg, &v) < 0 || v == 0) {
                rc = bad("--max-cpu-secs", optarg);
                goto out;
            }
            cfg.max_heapprofd_cpu_secs = v;
            break;
        case OPT_FORK:
            cfg.disable_fork_teardown = true;
            break;
        case OPT_STATUS:
            status_line = true;
            break;
        case OPT_NO_STATUS:
            status_line = false;
            break;
        case OPT_OTHER_USERS:
            cfg.allow_other_users = true;
            break;
        case OPT_NO_FAST_UNWIND:
            cfg.no_fast_unwind = true;
            break;
        case OPT_AUDIT_EVERY:
            if (parse_u64(optarg, &v) < 0 || v > UINT32_MAX) {
                rc = bad("--audit-every", optarg);
                goto out;
            }
            cfg.audit_every = (uint32_t)v;
            break;
        case 'h':
            usage(stdout);
            goto out;
        default:
            usage(stderr);
            rc = EXIT_USAGE;
            goto out;
        }
    }
    if (optind != argc) {
        fprintf(stderr, "heapprofd: unexpected argument '%s'\n", argv[optind]);
        rc = EXIT_USAGE;
        goto out;
    }
    if (svc_config_check(&cfg, err, sizeof(err)) < 0) {
        fprintf(stderr, "heapprofd: %s\n", err);
        rc = EXIT_USAGE;
        goto out;
    }
    if (!svc_config_has_targets(&cfg))
        fprintf(stderr, "heapprofd: no targets (-p, -n, --all, or pid/process_cmdline in the "
                        "config): processes that connect are left unprofiled\n");

    char dir[HP_PATH_MAX], sock[HP_PATH_MAX + 32], pidfile[HP_PATH_MAX + 32];
    pidfile[0] = '\0';
    if (!socket_path) {
        if (svc_runtime_dir_prepare(dir, sizeof(dir), err, sizeof(err)) < 0) {
            fprintf(stderr, "heapprofd: %s\n", err);
            rc = EXIT_PROFILER;
            goto out;
        }
        snprintf(sock, sizeof(sock), "%s/%s", dir, HP_DAEMON_SOCKET_NAME);
        snprintf(pidfile, sizeof(pidfile), "%s/heapprofd.pid", dir);
        socket_path = sock;
    }
    cfg.socket_path = socket_path;

    char out_buf[PATH_MAX];
    struct stat st;
    if (!output || (stat(output, &st) == 0 && S_ISDIR(st.st_mode))) {
        char ts[32];
        time_t now = time(NULL);
        struct tm tm;
        strftime(ts, sizeof(ts), "%Y%m%d-%H%M%S", localtime_r(&now, &tm));
        size_t dl = output ? strlen(output) : 0;
        while (dl > 1 && output[dl - 1] == '/')
            dl--;
        snprintf(out_buf, sizeof(out_buf), "%.*s%sheapprofd-%s-%d.pftrace", (int)dl,
                 output ? output : "", output ? "/" : "", ts, (int)getpid());
        output = out_buf;
    }
    out_fd = open(output, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (out_fd < 0) {
        fprintf(stderr, "heapprofd: cannot write the trace to '%s': %s\n", output, strerror(errno));
        rc = EXIT_PROFILER;
        goto out;
    }

    sigset_t old_mask;
    svc_loop_block_signals(&old_mask);
    svc_t *s = NULL;
    int r = svc_new(&cfg, out_fd, &s);
    if (r < 0) {
        fprintf(stderr, "heapprofd: cannot start: %s\n",
                r == -EADDRINUSE ? "another heapprofd is already running on that socket"
                                 : strerror(-r));
        rc = EXIT_PROFILER;
        goto out;
    }
    if (pidfile[0]) {
        FILE *f = fopen(pidfile, "we");
        if (f) {
            fprintf(f, "%d\n", (int)getpid());
            fclose(f);
        }
    }
    fprintf(stderr, "heapprofd: listening on %s, writing %s\n", socket_path, output);
    if (!cfg.no_running && svc_config_has_targets(&cfg))
        svc_proc_scan_targets(&cfg, signal_running, NULL);

    struct svc_loop_opts lo = {
        .dump_interval_ms = cfg.dump_interval_ms,
        .dump_phase_ms = cfg.dump_phase_ms,
        .status_line = status_line && isatty(STDERR_FILENO),
    };
    struct svc_loop_result res;
    r = svc_loop_run(s, &lo, &res);
    if (r < 0)
        hp_log_warn("%s", strerror(-r));
    svc_loop_arm_second_interrupt(out_fd, s);
    fprintf(stderr, "heapprofd: stopping (signal %d): dumping every process\n", res.signo);

    struct svc_summary sum;
    r = svc_finish(s, &sum);
    svc_free(s);
    if (pidfile[0])
        (void)unlink(pidfile);
    if (r < 0 || close(out_fd) < 0) {
        fprintf(stderr, "heapprofd: writing '%s' failed: %s\n", output,
                strerror(r < 0 ? -r : errno));
        out_fd = -1;
        rc = EXIT_PROFILER;
        goto out;
    }
    out_fd = -1;
    svc_print_summary(output, &sum, 0);
out:
    if (out_fd >= 0)
        (void)close(out_fd);
    svc_config_done(&cfg);
    return rc;
}

int main(int argc, char **argv)
{
    return cmd_daemon(argc, argv, argv[0]);
}
