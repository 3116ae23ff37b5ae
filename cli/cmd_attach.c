/* cli/cmd_attach.c: `heapprof attach` (profile running processes that have
 * libheapprof.so preloaded, woken by the attach signal) and `heapprof dump` (ask the
 * daemon for a dump now). */
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
#include "common/clock.h"
#include "common/log.h"
#include "common/macros.h"
#include "common/paths.h"

#define MAX_SIGNALLED 4096
#define CONNECT_GRACE_NS 2000000000ull

static void usage_attach(FILE *f)
{
    fputs("usage: heapprof attach (-p PID | -n NAME)... [options]\n"
          "\n"
          "Profiles running processes that were started with libheapprof.so preloaded\n"
          "(LD_PRELOAD=.../libheapprof.so): sends them the attach signal, profiles them until\n"
          "--duration ends, Ctrl-C, or they all exit, then dumps and detaches (they go back\n"
          "to dormant passthrough and can be attached again). With -n, processes that start\n"
          "later and match are picked up too.\n"
          "\n"
          "options:\n"
          "  -p, --pid PID                a process to profile (repeatable)\n"
          "  -n, --name NAME              processes whose argv[0] or its basename equals\n"
          "                               NAME or matches it as a glob (repeatable)\n"
          "  -d, --duration SEC           stop after SEC seconds\n"
          "  -o, --output FILE            trace file (default heapprof-attach-<pid>.pftrace)\n"
          "  -i, --sampling-interval N    mean bytes between samples (default 4096)\n"
          "      --continuous-dump MS[,PHASE_MS]  dump every MS milliseconds\n"
          "      --dump-at-max            report live memory at its peak\n"
          "      --shmem-size N           shared buffer per process (default 8M)\n"
          "      --block-client           make the app wait for buffer space\n"
          "      --no-status              no live status line (shown on a terminal)\n"
          "      --top N                  sites in the summary (default 10)\n"
          "  -q, --quiet                  no summary\n"
          "  -h, --help                   this help\n"
          "\n"
          "examples:\n"
          "  LD_PRELOAD=build/preload/libheapprof.so ./server &\n"
          "  heapprof attach -p $! --duration 30\n"
          "  heapprof attach -n 'worker-*' --continuous-dump 1000 -o workers.pftrace\n"
          "\n"
          "exit status: 0 done; 1 a target cannot be profiled; 2 usage error; 3 profiler\n"
          "failure.\n",
          f);
}

struct attach_state {
    struct svc_config *cfg;
    pid_t self;
    pid_t signalled[MAX_SIGNALLED];
    uint64_t signalled_ns[MAX_SIGNALLED];
    bool warned[MAX_SIGNALLED];
    size_t n_signalled;
    bool have_names;
    uint64_t next_scan_ns;
};

static bool already_signalled(struct attach_state *st, pid_t pid)
{
    for (size_t i = 0; i < st->n_signalled; i++)
        if (st->signalled[i] == pid)
            return true;
    return false;
}

static int signal_target(struct attach_state *st, const struct svc_proc *p, bool verbose)
{
    int r = svc_proc_signal_attach(p->pid, st->self);
    if (r < 0) {
        if (verbose || r != -ESRCH)
            fprintf(stderr, "heapprof attach: cannot signal pid %d (%s): %s\n", (int)p->pid,
                    p->name, r == -EPERM ? "it belongs to another user" : strerror(-r));
        return r;
    }
    if (st->n_signalled < MAX_SIGNALLED) {
        st->signalled[st->n_signalled] = p->pid;
        st->signalled_ns[st->n_signalled] = hp_clock_ns(CLOCK_MONOTONIC);
        st->warned[st->n_signalled] = false;
        st->n_signalled++;
    }
    if (verbose)
        fprintf(stderr, "heapprof attach: attaching to pid %d (%s)\n", (int)p->pid, p->name);
    return 0;
}

static void signal_new_target(void *ctx, const struct svc_proc *p)
{
    struct attach_state *st = ctx;
    if (p->same_user && !already_signalled(st, p->pid))
        (void)signal_target(st, p, true);
}

/* Signals running processes that match a name target and were not signalled yet. */
static void scan_names(struct attach_state *st)
{
    struct svc_config names = *st->cfg; /* names only: pids were signalled at start */
    names.n_pid = 0;
    names.all = false;
    svc_proc_scan_targets(&names, signal_new_target, st);
}

static bool attach_tick(void *ctx, svc_t *s)
{
    struct attach_state *st = ctx;
    uint64_t now = hp_clock_ns(CLOCK_MONOTONIC);
    if (st->have_names && now >= st->next_scan_ns) {
        scan_names(st);
        st->next_scan_ns = now + 500000000u;
    }
    for (size_t i = 0; i < st->n_signalled; i++) {
        if (st->warned[i] || now - st->signalled_ns[i] < CONNECT_GRACE_NS)
            continue;
        if (!svc_client_seen(s, st->signalled[i]) && kill(st->signalled[i], 0) == 0)
            fprintf(stderr,
                    "heapprof attach: pid %d did not answer the attach signal within 2 s "
                    "(its libheapprof.so may have the signal disabled, or another handler)\n",
                    (int)st->signalled[i]);
        st->warned[i] = true;
    }
    return false;
}

int cmd_attach(int argc, char **argv)
{
    static const struct option opts[] = {
        {"pid", required_argument, NULL, 'p'},
        {"name", required_argument, NULL, 'n'},
        {"duration", required_argument, NULL, 'd'},
        {"output", required_argument, NULL, 'o'},
        {"sampling-interval", required_argument, NULL, 'i'},
        {"continuous-dump", required_argument, NULL, 'C'},
        {"dump-at-max", no_argument, NULL, 'M'},
        {"shmem-size", required_argument, NULL, 'S'},
        {"block-client", no_argument, NULL, 'B'},
        {"status", no_argument, NULL, 'U'},
        {"no-status", no_argument, NULL, 'u'},
        {"top", required_argument, NULL, 't'},
        {"quiet", no_argument, NULL, 'q'},
        {"help", no_argument, NULL, 'h'},
        {0},
    };
    struct svc_config cfg;
    const char *output = NULL;
    double duration = 0;
    bool quiet = false, status_line = true; /* on a terminal */
    long top = 10;
    uint64_t bytes;
    int c, rc = 0, out_fd = -1;
    char *end;

    svc_config_init(&cfg);
    while ((c = getopt_long(argc, argv, "p:n:d:o:i:qh", opts, NULL)) != -1) {
        switch (c) {
        case 'p': {
            errno = 0;
            long v = strtol(optarg, &end, 10);
            if (errno || *end || v <= 0 || v > INT32_MAX || cfg.n_pid >= SVC_MAX_TARGETS) {
                fprintf(stderr, "heapprof attach: invalid pid '%s'\n", optarg);
                rc = EXIT_USAGE;
                goto out;
            }
            cfg.pid[cfg.n_pid++] = (int32_t)v;
            break;
        }
        case 'n':
            if (!*optarg || cfg.n_process_cmdline >= SVC_MAX_TARGETS) {
                fprintf(stderr, "heapprof attach: invalid name '%s'\n", optarg);
                rc = EXIT_USAGE;
                goto out;
            }
            cfg.process_cmdline[cfg.n_process_cmdline++] = strdup(optarg);
            break;
        case 'd':
            errno = 0;
            duration = strtod(optarg, &end);
            if (errno || *end || !(duration > 0) || duration > 1e9) {
                fprintf(stderr, "heapprof attach: invalid --duration '%s' (seconds > 0)\n", optarg);
                rc = EXIT_USAGE;
                goto out;
            }
            break;
        case 'o':
            output = optarg;
            break;
        case 'i':
            if (svc_parse_bytes(optarg, &bytes) < 0) {
                fprintf(stderr,
                        "heapprof attach: invalid sampling interval '%s': expected a number "
                        "of bytes >= 1\n",
                        optarg);
                rc = EXIT_USAGE;
                goto out;
            }
            cfg.sampling_interval_bytes = bytes;
            break;
        case 'C':
            if (parse_continuous_dump(optarg, &cfg) < 0) {
                fprintf(stderr, "heapprof attach: invalid --continuous-dump '%s'\n", optarg);
                rc = EXIT_USAGE;
                goto out;
            }
            break;
        case 'M':
            cfg.dump_at_max = true;
            break;
        case 'S':
            if (svc_parse_bytes(optarg, &bytes) < 0) {
                fprintf(stderr, "heapprof attach: invalid --shmem-size '%s'\n", optarg);
                rc = EXIT_USAGE;
                goto out;
            }
            cfg.shmem_size_bytes = bytes;
            break;
        case 'B':
            cfg.block_client = true;
            break;
        case 'U':
            status_line = true;
            break;
        case 'u':
            status_line = false;
            break;
        case 't':
            errno = 0;
            top = strtol(optarg, &end, 10);
            if (errno || *end || top < 0) {
                fprintf(stderr, "heapprof attach: invalid --top '%s'\n", optarg);
                rc = EXIT_USAGE;
                goto out;
            }
            break;
        case 'q':
            quiet = true;
            break;
        case 'h':
            usage_attach(stdout);
            goto out;
        default:
            usage_attach(stderr);
            rc = EXIT_USAGE;
            goto out;
        }
    }
    if (optind != argc || (cfg.n_pid == 0 && cfg.n_process_cmdline == 0)) {
        fprintf(stderr,
                optind != argc ? "heapprof attach: unexpected argument '%s'\n"
                               : "heapprof attach: name a process with -p or -n%s\n",
                optind != argc ? argv[optind] : "");
        usage_attach(stderr);
        rc = EXIT_USAGE;
        goto out;
    }
    char err[256];
    if (svc_config_check(&cfg, err, sizeof(err)) < 0) {
        fprintf(stderr, "heapprof attach: %s\n", err);
        rc = EXIT_USAGE;
        goto out;
    }

    /* Check explicit pids before anything is started: clear errors, no half sessions. */
    struct svc_proc procs[SVC_MAX_TARGETS];
    for (size_t i = 0; i < cfg.n_pid; i++) {
        int r = svc_proc_inspect(cfg.pid[i], &procs[i]);
        if (r == -ENOENT) {
            fprintf(stderr, "heapprof attach: no process with pid %d\n", (int)cfg.pid[i]);
            rc = 1;
        } else if (r < 0) {
            fprintf(stderr, "heapprof attach: cannot inspect pid %d: %s\n", (int)cfg.pid[i],
                    strerror(-r));
            rc = 1;
        } else if (!procs[i].same_user && geteuid() != 0) {
            fprintf(stderr,
                    "heapprof attach: pid %d (%s) belongs to another user; run heapprof as "
                    "that user (or as root)\n",
                    (int)cfg.pid[i], procs[i].name);
            rc = 1;
        } else if (!procs[i].preloaded) {
            fprintf(stderr,
                    "heapprof attach: pid %d (%s) does not have libheapprof.so loaded; start it "
                    "with LD_PRELOAD=/path/to/libheapprof.so to make it attachable\n",
                    (int)cfg.pid[i], procs[i].name);
            rc = 1;
        }
    }
    if (rc)
        goto out;

    char dir[HP_PATH_MAX], sock[HP_PATH_MAX];
    if (svc_runtime_dir_prepare(dir, sizeof(dir), err, sizeof(err)) < 0) {
        fprintf(stderr, "heapprof attach: %s\n", err);
        rc = EXIT_PROFILER;
        goto out;
    }
    if (hp_socket_path(getenv("XDG_RUNTIME_DIR"), getuid(), getpid(), sock, sizeof(sock)) < 0) {
        fprintf(stderr, "heapprof attach: socket path too long\n");
        rc = EXIT_PROFILER;
        goto out;
    }
    cfg.socket_path = sock;

    char out_buf[PATH_MAX];
    if (!output) {
        if (cfg.n_pid == 1)
            snprintf(out_buf, sizeof(out_buf), "heapprof-%s-%d.pftrace", procs[0].name,
                     (int)cfg.pid[0]);
        else
            snprintf(out_buf, sizeof(out_buf), "heapprof-attach-%d.pftrace", (int)getpid());
        output = out_buf;
    }
    out_fd = open(output, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (out_fd < 0) {
        fprintf(stderr, "heapprof attach: cannot write the trace to '%s': %s\n", output,
                strerror(errno));
        rc = EXIT_PROFILER;
        goto out;
    }

    sigset_t old_mask;
    svc_loop_block_signals(&old_mask);
    svc_t *s = NULL;
    int r = svc_new(&cfg, out_fd, &s);
    if (r < 0) {
        fprintf(stderr, "heapprof attach: cannot start the profiling service: %s\n", strerror(-r));
        rc = EXIT_PROFILER;
        goto out;
    }

    struct attach_state *st = calloc(1, sizeof(*st));
    if (!st) {
        rc = EXIT_PROFILER;
        svc_free(s);
        goto out;
    }
    st->cfg = &cfg;
    st->self = getpid();
    st->have_names = cfg.n_process_cmdline > 0;
    for (size_t i = 0; i < cfg.n_pid; i++)
        (void)signal_target(st, &procs[i], !quiet);
    if (st->have_names) {
        scan_names(st);
        st->next_scan_ns = hp_clock_ns(CLOCK_MONOTONIC) + 500000000u;
    }

    struct svc_loop_opts lo = {
        .dump_interval_ms = cfg.dump_interval_ms,
        .dump_phase_ms = cfg.dump_phase_ms,
        .duration_ms = (uint64_t)(duration * 1000),
        .status_line = !quiet && status_line && isatty(STDERR_FILENO),
        .stop_when_no_clients = !st->have_names,
        .tick = attach_tick,
        .tick_ctx = st,
    };
    struct svc_loop_result res;
    r = svc_loop_run(s, &lo, &res);
    if (r < 0)
        hp_log_warn("%s", strerror(-r));
    svc_loop_arm_second_interrupt(out_fd, s);
    if (!quiet && res.signo)
        fprintf(stderr, "\nheapprof attach: stopping (signal %d); dumping and detaching\n",
                res.signo);

    struct svc_summary sum;
    r = svc_finish(s, &sum);
    svc_free(s);
    free(st);
    if (r < 0 || close(out_fd) < 0) {
        fprintf(stderr, "heapprof attach: writing '%s' failed: %s\n", output,
                strerror(r < 0 ? -r : errno));
        out_fd = -1;
        rc = EXIT_PROFILER;
        goto out;
    }
    out_fd = -1;
    if (!quiet)
        svc_print_summary(output, &sum, (int)top);
out:
    if (out_fd >= 0)
        (void)close(out_fd);
    svc_config_done(&cfg);
    return rc;
}

int cmd_dump(int argc, char **argv)
{
    if (argc > 1 && (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help"))) {
        puts("usage: heapprof dump [DAEMON_PID]\n"
             "\n"
             "Asks the running heapprofd (found through its pid file in the runtime\n"
             "directory, or given) to dump every profiled process now (SIGUSR1).\n");
        return 0;
    }
    pid_t pid = 0;
    if (argc > 2) {
        fprintf(stderr, "heapprof dump: too many arguments\n");
        return EXIT_USAGE;
    }
    if (argc == 2) {
        char *end;
        long v = strtol(argv[1], &end, 10);
        if (*end || v <= 0 || v > INT32_MAX) {
            fprintf(stderr, "heapprof dump: invalid pid '%s'\n", argv[1]);
            return EXIT_USAGE;
        }
        pid = (pid_t)v;
    } else {
        char dir[HP_PATH_MAX], path[HP_PATH_MAX + 32], buf[32];
        if (hp_runtime_dir(getenv("XDG_RUNTIME_DIR"), getuid(), dir, sizeof(dir)) < 0)
            return EXIT_PROFILER;
        snprintf(path, sizeof(path), "%s/heapprofd.pid", dir);
        FILE *f = fopen(path, "re");
        if (!f || !fgets(buf, sizeof(buf), f)) {
            fprintf(stderr, "heapprof dump: no heapprofd running (no %s)\n", path);
            if (f)
                fclose(f);
            return 1;
        }
        fclose(f);
        pid = (pid_t)atoi(buf);
    }
    if (pid <= 0 || kill(pid, SIGUSR1) < 0) {
        fprintf(stderr, "heapprof dump: cannot signal heapprofd (pid %d): %s\n", (int)pid,
                strerror(errno));
        return 1;
    }
    fprintf(stderr, "heapprof dump: asked heapprofd (pid %d) to dump\n", (int)pid);
    return 0;
}
