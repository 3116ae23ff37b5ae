/* cli/cmd_attach.c: `heapprof attach` (profile running processes that have
 * libheapprof.so preloaded, woken through the entry they advertise, service/wake.c) and
 * `heapprof dump` (ask the daemon for a dump now, over its socket). */
#include "cli/cli.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <limits.h>
#include <pwd.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/log.h"
#include "common/macros.h"
#include "common/paths.h"

#define MAX_TRIED 4096
#define CONNECT_GRACE_NS 2000000000ull
/* A woken process that has not connected by then is given up (the session may end). */
#define CONNECT_GIVE_UP_NS 10000000000ull
/* A process named with -p that maps the library but has no attach handler yet (still in
 * its constructors) is looked at again every tick, this long at most. */
#define READY_WAIT_NS 5000000000ull

/* The configuration fields `heapprof attach` offers as options. */
static const struct cli_field attach_fields[] = {
    {"pid", "pid", 'p'},
    {"process_cmdline", "name", 'n'},
    {"sampling_interval_bytes", NULL, 0},
    {"continuous_dump_config", NULL, 0},
    {"dump_at_max", NULL, 0},
    {"shmem_size_bytes", NULL, 0},
    {"block_client", NULL, 0},
    {"block_client_timeout_us", NULL, 0},
    {"no_source_lines", NULL, 0},
    {"heaps", NULL, 0},
    {"all_heaps", NULL, 0},
    {"allow_other_users", NULL, 0},
    {NULL, NULL, 0},
};

static const struct option attach_own_opts[] = {
    {"duration", required_argument, NULL, 'd'},
    {"output", required_argument, NULL, 'o'},
    {"status", no_argument, NULL, CLI_OPT_STATUS},
    {"no-status", no_argument, NULL, CLI_OPT_NO_STATUS},
    {"top", required_argument, NULL, CLI_OPT_TOP},
    {"quiet", no_argument, NULL, 'q'},
    {"help", no_argument, NULL, 'h'},
    {0},
};

static void usage_attach(FILE *f, const struct cli_opts *o)
{
    fputs("usage: heapprof attach (-p PID | -n NAME)... [options]\n"
          "\n"
          "Profiles running processes: wakes the ones started with libheapprof.so preloaded\n"
          "(LD_PRELOAD=.../libheapprof.so; a ptrace call, no signal) and loads the library\n"
          "into the others (dlopen on one thread taken at a safe point; the other threads\n"
          "keep running), profiles them until --duration ends, Ctrl-C, or they all exit,\n"
          "then dumps and detaches (they go back to dormant and can be attached again).\n"
          "With -n, processes that start later and match are picked up too.\n"
          "\n"
          "-n NAME matches what pgrep shows: NAME, exact or a glob, is compared with the\n"
          "process name (/proc/PID/comm, what `pgrep NAME` matches), argv[0] and its\n"
          "basename, and the title (the command line as ps and `pgrep -f` show it): -n nginx\n"
          "finds 'nginx: master process /usr/sbin/nginx', -n 'postgres: *' every retitled\n"
          "postgres child.\n"
          "\n"
          "options:\n",
          f);
    cli_opts_help(f, o);
    fputs("  -d, --duration SEC           stop after SEC seconds\n"
          "  -o, --output FILE            trace file (default heapprof-attach-<pid>.pftrace)\n"
          "      --no-status              no live status line (shown on a terminal)\n"
          "      --top N                  sites in the summary (default 10)\n"
          "  -q, --quiet                  no summary\n"
          "  -h, --help                   this help\n"
          "\n"
          "examples:\n"
          "  ./server & heapprof attach -p $! --duration 30\n"
          "  heapprof attach -n 'worker-*' --continuous-dump 1000 -o workers.pftrace\n"
          "\n"
          "exit status: 0 at least one process was profiled; 1 none was (each process that\n"
          "could not be is named with the reason: another user's, not dumpable, already\n"
          "profiled, static binary, stopped, traced, seccomp...); 2 usage error; 3\n"
          "profiler failure.\n",
          f);
}

/* A process we tried to attach: tried (and reported) once. */
struct attach_tried {
    pid_t pid;
    char name[64];
    uint64_t woken_ns; /* 0: not woken (refused, said why) */
    bool warned;       /* said it has not connected yet */
    bool settled;      /* woken, and connected, gone, or given up */
    bool in_container; /* told to connect to a socket made inside its root */
};

struct attach_state {
    struct svc_config *cfg;
    svc_t *svc; /* once started */
    pid_t self;
    struct attach_tried tried[MAX_TRIED];
    size_t n_tried;
    size_t n_pending;   /* woken, neither connected nor said not to yet */
    size_t n_connected; /* of those woken, connected */
    bool have_names;
    bool verbose;
    uint64_t next_scan_ns;
    struct svc_proc procs[SVC_MAX_TARGETS];     /* of the pids given */
    bool refused[SVC_MAX_TARGETS];              /* said why already: not tried */
    uint64_t waiting_since_ns[SVC_MAX_TARGETS]; /* not attachable yet; 0: not waiting */
    size_t n_waiting;
};

static bool already_tried(struct attach_state *st, pid_t pid)
{
    for (size_t i = 0; i < st->n_tried; i++)
        if (st->tried[i].pid == pid)
            return true;
    return false;
}

static void remember(struct attach_state *st, const struct svc_proc *p, bool woken)
{
    if (st->n_tried >= MAX_TRIED)
        return;
    struct attach_tried *t = &st->tried[st->n_tried++];
    t->pid = p->pid;
    snprintf(t->name, sizeof(t->name), "%s", p->name);
    t->woken_ns = woken ? hp_clock_ns(CLOCK_MONOTONIC) : 0;
    t->settled = t->warned = false;
    t->in_container = svc_proc_in_container(p);
    if (woken)
        st->n_pending++;
}

/* Why @p cannot be attached before a wake, with what to do, in @why; 0 when it can. */
static int check_target(const struct svc_proc *p, bool other_users, char *why, size_t len)
{
    int r = svc_proc_check(p, other_users, why, len);
    struct passwd pw, *res = NULL;
    char tmp[1024];
    size_t n = strlen(why);
    const char *or_root = geteuid() == 0 ? ", or give --allow-other-users" : "";
    if (r == -EACCES && getpwuid_r(p->uid, &pw, tmp, sizeof(tmp), &res) == 0 && res)
        snprintf(why + n, len - n,
                 "; run heapprof attach as that user (sudo -u %s heapprof attach -p %d)%s",
                 res->pw_name, (int)p->pid, or_root);
    else if (r == -EACCES)
        snprintf(why + n, len - n, "; run heapprof attach as that user%s", or_root);
    return r;
}

/* Attaches @p: checks it can be, then wakes it. Returns 0 (woken), -EAGAIN (not
 * advertised yet: the caller waits or moves on), or < 0 after saying why (unless it is
 * gone and not @verbose). */
static int attach_target(struct attach_state *st, const struct svc_proc *p, bool verbose)
{
    char why[768];
    why[0] = '\0';
    int r = check_target(p, st->cfg->allow_other_users, why, sizeof(why));
    if (r == 0) {
        struct svc_rcall_stats inj = {0};
        /* In a container, to a socket made for it inside its root. */
        r = svc_proc_attach_for(st->svc, p, st->self, why, sizeof(why), &inj);
        if (r == -EAGAIN)
            return r;
        if (inj.tid)
            fprintf(stderr,
                    "heapprof attach: pid %d (%s) now has libheapprof.so loaded (thread %d stopped "
                    "%.2f ms, %.1f ms in all)\n",
                    (int)p->pid, p->name, (int)inj.tid, (double)inj.stop_ns / 1e6,
                    (double)inj.total_ns / 1e6);
    }
    if (r < 0 && (verbose || r != -ESRCH))
        fprintf(stderr, "heapprof attach: pid %d (%s) %s\n", (int)p->pid, p->name,
                why[0] ? why : strerror(-r));
    remember(st, p, r == 0);
    if (r == 0 && verbose)
        fprintf(stderr, "heapprof attach: attaching to pid %d (%s)\n", (int)p->pid, p->name);
    return r;
}

static void attach_new_target(void *ctx, const struct svc_proc *p)
{
    struct attach_state *st = ctx;
    /* Not ready (still starting): left for the next scan. One without the library, or
     * that we may not read, is tried once, to say why it cannot be attached. */
    if (!already_tried(st, p->pid) && (p->attach_ready || !p->preloaded))
        (void)attach_target(st, p, true);
}

/* Attaches pid target @i, or starts waiting until it advertises its wake entry. */
static void attach_pid(struct attach_state *st, size_t i, uint64_t now)
{
    struct svc_proc *p = &st->procs[i];
    if (st->refused[i] || attach_target(st, p, st->verbose) != -EAGAIN)
        return;
    st->waiting_since_ns[i] = now;
    st->n_waiting++;
    if (st->verbose)
        fprintf(stderr,
                "heapprof attach: pid %d (%s) has libheapprof.so but has not advertised its "
                "wake entry yet (still starting?); waiting for it\n",
                (int)p->pid, p->name);
}

/* Looks again at the pid targets that were not attachable yet. */
static void check_waiting(struct attach_state *st, uint64_t now)
{
    for (size_t i = 0; i < st->cfg->n_pid && st->n_waiting; i++) {
        if (!st->waiting_since_ns[i])
            continue;
        struct svc_proc *p = &st->procs[i], q;
        const char *why = NULL;
        if (svc_proc_inspect(p->pid, &q) < 0 || q.start_time != p->start_time)
            why = "exited before it could be attached";
        else if (q.attach_ready)
            why = attach_target(st, &q, st->verbose) == -EAGAIN ? NULL : "";
        else if (now - st->waiting_since_ns[i] >= READY_WAIT_NS)
            why = "never advertised its wake entry (started with HEAPPROF_ATTACH=0, "
                  "which turns attaching off)";
        if (!why)
            continue;
        st->waiting_since_ns[i] = 0;
        st->n_waiting--;
        if (*why)
            fprintf(stderr, "heapprof attach: pid %d (%s) %s; not attached\n", (int)p->pid, p->name,
                    why);
    }
}

/* Attaches running processes that match a name target and were not tried yet. */
static void scan_names(struct attach_state *st)
{
    struct svc_config names = *st->cfg; /* names only: pids were tried at start */
    names.n_pid = 0;
    names.all = false;
    svc_proc_scan_targets(&names, attach_new_target, st);
}

/* Settles the woken processes: connected, gone, or given up after CONNECT_GIVE_UP_NS;
 * says once when one has not connected after CONNECT_GRACE_NS. */
static void check_woken(struct attach_state *st, svc_t *s)
{
    uint64_t now = hp_clock_ns(CLOCK_MONOTONIC); /* after the wakes of this tick */
    for (size_t i = 0; i < st->n_tried && st->n_pending; i++) {
        struct attach_tried *t = &st->tried[i];
        if (!t->woken_ns || t->settled)
            continue;
        bool seen = svc_client_seen(s, t->pid);
        if (!seen && !t->warned && now - t->woken_ns >= CONNECT_GRACE_NS && kill(t->pid, 0) == 0) {
            /* A container's process was told the socket's path: no runtime directory of
             * its own is looked at. */
            if (t->in_container)
                fprintf(stderr,
                        "heapprof attach: pid %d (%s) was woken but has not connected within "
                        "2 s to the socket made for it inside its root, in its /tmp or "
                        "/dev/shm (a busy machine? or a security profile of its container "
                        "that keeps it from connecting there)\n",
                        (int)t->pid, t->name);
            else
                fprintf(stderr,
                        "heapprof attach: pid %d (%s) was woken but has not connected within "
                        "2 s (still starting? it looks for this session's socket in its own "
                        "runtime directory, $XDG_RUNTIME_DIR/heapprof else /tmp/heapprof-UID: "
                        "was it started with another XDG_RUNTIME_DIR?)\n",
                        (int)t->pid, t->name);
            t->warned = true;
        }
        if (!seen && kill(t->pid, 0) == 0 && now - t->woken_ns < CONNECT_GIVE_UP_NS)
            continue;
        st->n_connected += seen;
        t->settled = true;
        svc_unlisten_in(s, t->pid); /* given up: its socket in a container goes */
        st->n_pending--;
    }
}

static bool attach_tick(void *ctx, svc_t *s)
{
    struct attach_state *st = ctx;
    uint64_t now = hp_clock_ns(CLOCK_MONOTONIC);
    if (st->n_waiting)
        check_waiting(st, now);
    if (st->have_names && now >= st->next_scan_ns) {
        scan_names(st);
        st->next_scan_ns = now + 500000000u;
    }
    check_woken(st, s);
    /* Nothing attached and nothing left to wait for (once attached, the loop ends when
     * the last process has gone). */
    return !st->n_waiting && !st->n_pending && !st->have_names && !st->n_connected;
}

/* The -n names, quoted and joined, for messages. */
static const char *names_of(const struct svc_config *cfg, char *buf, size_t len)
{
    size_t n = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < cfg->n_process_cmdline && n < len; i++) {
        int k = snprintf(buf + n, len - n, "%s'%s'", i ? ", " : "", cfg->process_cmdline[i]);
        if (k < 0)
            break;
        n += (size_t)k;
    }
    return buf;
}

static int attach_started(void *ctx, svc_t *s)
{
    struct attach_state *st = ctx;
    st->svc = s;
    uint64_t now = hp_clock_ns(CLOCK_MONOTONIC);
    for (size_t i = 0; i < st->cfg->n_pid; i++)
        attach_pid(st, i, now);
    if (st->have_names) {
        scan_names(st);
        st->next_scan_ns = hp_clock_ns(CLOCK_MONOTONIC) + 500000000u;
        char names[512];
        if (st->n_tried == 0 && st->verbose)
            fprintf(stderr,
                    "heapprof attach: no running process matches %s yet; waiting for one to "
                    "start\n",
                    names_of(st->cfg, names, sizeof(names)));
    }
    return 0;
}

static void attach_stopping(void *ctx, const struct cli_loop_result *res)
{
    struct attach_state *st = ctx;
    if (st->verbose && res->signo)
        fprintf(stderr, "\nheapprof attach: stopping (signal %d); dumping and detaching\n",
                res->signo);
    /* Woken but not connected yet: the session ends without it, and says so (a busy
     * machine can take longer than a short --duration to run its session thread). */
    uint64_t now = hp_clock_ns(CLOCK_MONOTONIC);
    for (size_t i = 0; i < st->n_tried; i++) {
        const struct attach_tried *t = &st->tried[i];
        if (t->woken_ns && !t->settled && kill(t->pid, 0) == 0)
            fprintf(stderr,
                    "heapprof attach: pid %d (%s) was woken %.1f s ago but had not connected "
                    "when the session ended; it is not in the profile (a longer --duration "
                    "gives it time on a busy machine)\n",
                    (int)t->pid, t->name, (double)(now - t->woken_ns) / 1e9);
    }
}

/* What the command line asks for. */
struct attach_args {
    struct svc_config cfg;
    struct cli_common_opts common;
    double duration; /* seconds; 0: no limit */
};

/* Fills @a from the command line and checks it. Returns < 0 after a usage error (message
 * printed), 0 after --help, > 0 to go on. */
static int attach_parse_args(int argc, char **argv, const struct cli_opts *opts,
                             struct attach_args *a)
{
    int c;
    char *end;
    while ((c = getopt_long(argc, argv, opts->shortopts, opts->longopts, NULL)) != -1) {
        int r = cli_opts_apply(opts, c, optarg, &a->cfg, "heapprof attach");
        if (r == 0)
            r = cli_common_apply(&a->common, c, optarg, "heapprof attach");
        if (r < 0)
            return -EINVAL;
        if (r > 0)
            continue;
        switch (c) {
        case 'd':
            errno = 0;
            a->duration = strtod(optarg, &end);
            if (errno || *end || !(a->duration > 0) || a->duration > 1e9) {
                fprintf(stderr, "heapprof attach: invalid --duration '%s' (seconds > 0)\n", optarg);
                return -EINVAL;
            }
            break;
        case 'h':
            usage_attach(stdout, opts);
            return 0;
        default:
            usage_attach(stderr, opts);
            return -EINVAL;
        }
    }
    if (optind != argc || (a->cfg.n_pid == 0 && a->cfg.n_process_cmdline == 0)) {
        fprintf(stderr,
                optind != argc ? "heapprof attach: unexpected argument '%s'\n"
                               : "heapprof attach: name a process with -p or -n%s\n",
                optind != argc ? argv[optind] : "");
        usage_attach(stderr, opts);
        return -EINVAL;
    }
    if (a->cfg.allow_other_users && geteuid() != 0) {
        fprintf(stderr, "heapprof attach: --allow-other-users needs root (only root may profile "
                        "another user's processes)\n");
        return -EINVAL;
    }
    char err[256];
    if (svc_config_check(&a->cfg, err, sizeof(err)) < 0) {
        fprintf(stderr, "heapprof attach: %s\n", err);
        return -EINVAL;
    }
    return 1;
}

/* Looks at every pid given before anything is started: clear errors, no half sessions.
 * Returns 0, or 1 after a message for a pid that does not exist or for every pid when
 * none can be attached (and no name is given). */
static int inspect_pids(struct attach_state *st)
{
    const struct svc_config *cfg = st->cfg;
    int rc = 0;
    size_t n_refused = 0;
    for (size_t i = 0; i < cfg->n_pid; i++) {
        struct svc_proc *p = &st->procs[i];
        char why[768];
        int r = svc_proc_inspect(cfg->pid[i], p);
        if (r == -ENOENT) {
            fprintf(stderr, "heapprof attach: no process with pid %d\n", (int)cfg->pid[i]);
            rc = 1;
        } else if (r < 0) {
            fprintf(stderr, "heapprof attach: cannot inspect pid %d: %s\n", (int)cfg->pid[i],
                    strerror(-r));
            rc = 1;
        } else if (check_target(p, cfg->allow_other_users, why, sizeof(why)) < 0) {
            fprintf(stderr, "heapprof attach: pid %d (%s) %s\n", (int)p->pid, p->name, why);
            st->refused[i] = true;
            n_refused++;
        }
    }
    if (n_refused == cfg->n_pid && !st->have_names)
        rc = 1;
    return rc;
}

/* Our own socket, named after our pid, in the runtime directory (made if needed): the
 * targets learn it from the attach signal. Returns 0, or EXIT_PROFILER after a message. */
static int attach_socket_path(char *sock, size_t len)
{
    char dir[HP_PATH_MAX], err[256];
    if (hp_runtime_dir_prepare(dir, sizeof(dir), err, sizeof(err)) < 0) {
        fprintf(stderr, "heapprof attach: %s\n", err);
        return EXIT_PROFILER;
    }
    if (hp_socket_path(getenv("XDG_RUNTIME_DIR"), getuid(), getpid(), sock, len) < 0) {
        fprintf(stderr, "heapprof attach: socket path too long\n");
        return EXIT_PROFILER;
    }
    return 0;
}

/* Profiles the targets for one session. Returns the exit status. */
static int attach_run(struct attach_args *a)
{
    HP_CLEANUP_FREE struct attach_state *st = calloc(1, sizeof(*st));
    if (!st)
        return EXIT_PROFILER;
    struct svc_config *cfg = &a->cfg;
    st->cfg = cfg;
    st->self = getpid();
    st->have_names = cfg->n_process_cmdline > 0;
    st->verbose = !a->common.quiet;

    int rc = inspect_pids(st);
    if (rc)
        return rc;
    char sock[HP_PATH_MAX];
    rc = attach_socket_path(sock, sizeof(sock));
    if (rc)
        return rc;
    /* Targets of other users cannot enter our runtime directory: an abstract socket
     * (common/paths.h). */
    if (cfg->allow_other_users && hp_attach_abstract_name(getpid(), sock, sizeof(sock)) < 0)
        return EXIT_PROFILER;
    cfg->socket_path = sock;
    /* A session does not follow forks; a name picks up the children, dormant like their
     * parent, as they start. */
    cfg->fork_hint = "attach them by name with -n, which also takes the processes that "
                     "start later";

    const char *output = a->common.output;
    char out_buf[PATH_MAX];
    uint64_t processes = 0;
    if (!output) {
        if (cfg->n_pid == 1)
            snprintf(out_buf, sizeof(out_buf), "heapprof-%s-%d.pftrace", st->procs[0].prog,
                     (int)cfg->pid[0]);
        else
            snprintf(out_buf, sizeof(out_buf), "heapprof-attach-%d.pftrace", (int)getpid());
        output = out_buf;
    }
    struct cli_session cs = {
        .prog = "heapprof attach",
        .cfg = cfg,
        .output = output,
        .output_made_up = !a->common.output,
        .quiet = a->common.quiet,
        .drop_if_empty = true,
        .top = (int)a->common.top,
        .loop =
            {
                .duration_ms = (uint64_t)(a->duration * 1000),
                .status_line = !a->common.quiet && a->common.status_line && isatty(STDERR_FILENO),
                .stop_when_no_clients = !st->have_names,
                .tick = attach_tick,
                .tick_ctx = st,
            },
        .started = attach_started,
        .stopping = attach_stopping,
        .ctx = st,
        .ret_processes = &processes,
    };
    struct cli_loop_result res;
    rc = cli_session_run(&cs, &res);
    if (rc == 0 && st->have_names && cfg->n_pid == 0 && st->n_tried == 0) {
        char names[512];
        fprintf(stderr, "heapprof attach: no process matched %s: nothing was profiled\n",
                names_of(cfg, names, sizeof(names)));
    }
    /* Each process that could not be attached was named with the reason. */
    if (rc == 0 && processes == 0)
        rc = 1;
    return rc;
}

int cmd_attach(int argc, char **argv)
{
    struct cli_opts opts;
    struct attach_args a = {.common = {.status_line = true /* on a terminal */, .top = 10}};
    svc_config_init(&a.cfg);
    if (cli_opts_build(&opts, attach_own_opts, "d:o:qh", attach_fields) < 0)
        return EXIT_PROFILER;
    int r = attach_parse_args(argc, argv, &opts, &a);
    cli_opts_done(&opts);
    if (r > 0)
        cli_set_inject_library();
    int rc = r < 0 ? EXIT_USAGE : r == 0 ? 0 : attach_run(&a);
    svc_config_done(&a.cfg);
    return rc;
}

static const char dump_usage[] =
    "usage: heapprof dump [--socket PATH] [DAEMON_PID]\n"
    "\n"
    "Asks the running heapprofd to dump every profiled process now: a request on its\n"
    "socket (default <runtime dir>/heapprofd.sock, the runtime dir being\n"
    "$XDG_RUNTIME_DIR/heapprof or /tmp/heapprof-<uid>), which it answers. With\n"
    "DAEMON_PID, the daemon that answers must be that process. No process is ever\n"
    "signalled.\n";

struct dump_args {
    const char *socket_path; /* NULL: the daemon's default */
    pid_t want;              /* 0: whichever daemon answers */
};

/* Fills @a from the command line. Returns < 0 after a usage error (message printed), 0
 * after --help, > 0 to go on. */
static int dump_parse_args(int argc, char **argv, struct dump_args *a)
{
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            fputs(dump_usage, stdout);
            return 0;
        }
        if (!strcmp(argv[i], "--socket") && i + 1 < argc) {
            a->socket_path = argv[++i];
            continue;
        }
        char *end;
        long v = strtol(argv[i], &end, 10);
        if (a->want || argv[i][0] == '-' || *end || v <= 0 || v > INT32_MAX) {
            fprintf(stderr, "heapprof dump: invalid argument '%s'\n%s", argv[i], dump_usage);
            return -EINVAL;
        }
        a->want = (pid_t)v;
    }
    return 1;
}

int cmd_dump(int argc, char **argv)
{
    struct dump_args a = {0};
    int r = dump_parse_args(argc, argv, &a);
    if (r <= 0)
        return r < 0 ? EXIT_USAGE : 0;
    const char *socket_path = a.socket_path;
    char path[HP_PATH_MAX];
    if (!socket_path) {
        if (hp_socket_path(getenv("XDG_RUNTIME_DIR"), getuid(), 0, path, sizeof(path)) < 0) {
            fprintf(stderr, "heapprof dump: socket path too long\n");
            return EXIT_PROFILER;
        }
        socket_path = path;
    }
    pid_t daemon = 0;
    r = svc_control_dump(socket_path, a.want, &daemon);
    if (r == -ENOENT || r == -ECONNREFUSED) {
        fprintf(stderr, "heapprof dump: no heapprofd is running (nothing listens on %s)\n",
                socket_path);
        return 1;
    }
    if (r == -ESRCH) {
        fprintf(stderr,
                "heapprof dump: pid %d is not the heapprofd listening on %s (pid %d is); "
                "nothing asked\n",
                (int)a.want, socket_path, (int)daemon);
        return 1;
    }
    if (r < 0) {
        fprintf(stderr, "heapprof dump: %s: %s\n", socket_path,
                r == -EPROTO      ? "what answers there is not heapprofd"
                : r == -EACCES    ? "the service there runs as another user"
                : r == -ETIMEDOUT ? "heapprofd did not answer"
                                  : strerror(-r));
        return 1;
    }
    fprintf(stderr, "heapprof dump: asked heapprofd (pid %d) to dump\n", (int)daemon);
    return 0;
}
