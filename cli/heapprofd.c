/* cli/heapprofd.c: the heapprof daemon. Processes started with libheapprof.so
 * preloaded connect to its socket at startup; those matching the targets are profiled
 * from startup and dumped when they exit; running targets are attached (woken, or the
 * library loaded into them: service/inject.h). */
#include "cli/cli.h"

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

#include "common/log.h"
#include "common/macros.h"
#include "common/paths.h"
#include "http/http.h"

/* The daemon offers every configuration field as an option. */
static struct cli_field daemon_fields[64];

static void daemon_fields_init(void)
{
    size_t k = 0;
    for (size_t i = 0; i < svc_n_config_fields && k + 2 < HP_ARRAY_SIZE(daemon_fields); i++) {
        const struct svc_config_field *f = &svc_config_fields[i];
        if (f->flags & SVC_FIELD_NESTED_DUMP) {
            if (f->proto_id == 5) /* once, for both nested fields */
                daemon_fields[k++] = (struct cli_field){"continuous_dump_config", NULL, 0};
        } else if (f->flag) {
            daemon_fields[k++] = (struct cli_field){f->name, NULL, 0};
        }
    }
    daemon_fields[k] = (struct cli_field){NULL, NULL, 0};
}

enum {
    OPT_CONFIG = 256,
    OPT_SOCKET,
    OPT_PRODUCER,
    OPT_PRODUCER_SOCKET,
    OPT_DATA_SOURCE,
    OPT_HTTP,
    OPT_HTTP_ALLOW_REMOTE,
};

static const struct option daemon_own_opts[] = {
    {"config", required_argument, NULL, OPT_CONFIG},
    {"socket", required_argument, NULL, OPT_SOCKET},
    {"output", required_argument, NULL, 'o'},
    {"status", no_argument, NULL, CLI_OPT_STATUS},
    {"no-status", no_argument, NULL, CLI_OPT_NO_STATUS},
    {"producer", no_argument, NULL, OPT_PRODUCER},
    {"producer-socket", required_argument, NULL, OPT_PRODUCER_SOCKET},
    {"data-source", required_argument, NULL, OPT_DATA_SOURCE},
    {"http", required_argument, NULL, OPT_HTTP},
    {"http-allow-remote", no_argument, NULL, OPT_HTTP_ALLOW_REMOTE},
    {"help", no_argument, NULL, 'h'},
    {0},
};

static void usage(FILE *f, const struct cli_opts *o)
{
    fputs("usage: heapprofd [options]\n"
          "\n"
          "Runs the heapprof service in the foreground (logs on stderr). Processes started\n"
          "with LD_PRELOAD=.../libheapprof.so connect to it at startup; those matching the\n"
          "targets are profiled from their first allocation and dumped when they exit.\n"
          "Running targets are attached (unless --no-running): woken by a ptrace call when\n"
          "they have the library, the library loaded into them when not (with -p and -n;\n"
          "--all takes only processes that have it). Stop with Ctrl-C or SIGTERM: every\n"
          "process is dumped and the trace completed; a second Ctrl-C exits at once.\n"
          "'heapprof dump' (a request on the socket) or SIGUSR1 dumps now.\n"
          "\n"
          "options (each configuration option is also a field of the config file, named as\n"
          "in Perfetto's HeapprofdConfig):\n"
          "      --config FILE            HeapprofdConfig in protobuf text format; flags given\n"
          "                               after it override it\n"
          "      --socket PATH            listen here (default <runtime dir>/heapprofd.sock,\n"
          "                               the runtime dir being $XDG_RUNTIME_DIR/heapprof or\n"
          "                               /tmp/heapprof-<uid>); clients: HEAPPROF_SOCKET\n"
          "  -o, --output FILE|DIR        trace file, or directory for a new one (default\n"
          "                               ./heapprofd-<date>-<pid>.pftrace)\n",
          f);
    cli_opts_help(f, o);
    fputs("      --producer               be a data source of Perfetto's tracing service\n"
          "                               (traced) instead of writing a file: each tracing\n"
          "                               session that enables android.heapprofd gets its\n"
          "                               own profile, configured by its heapprofd_config\n"
          "      --producer-socket NAME   traced's producer socket (default\n"
          "                               $PERFETTO_PRODUCER_SOCK_NAME, else\n"
          "                               /run/perfetto/traced-producer.sock or\n"
          "                               /tmp/perfetto-producer)\n"
          "      --data-source NAME       data source name (default android.heapprofd)\n"
          "      --http [ADDR:]PORT       serve each profiled process's profile as it stands,\n"
          "                               in pprof's format: /debug/pprof/heap?pid=N (or\n"
          "                               ?name=NAME), /debug/pprof/allocs?pid=N, and the\n"
          "                               processes at /; ADDR defaults to 127.0.0.1, PORT 0\n"
          "                               takes a free one (the log says which)\n"
          "      --http-allow-remote      let --http listen on an address that is not\n"
          "                               loopback (no authentication: anyone who reaches it\n"
          "                               reads the profiles)\n"
          "      --no-status              no live status line (shown on a terminal)\n"
          "  -h, --help                   this help\n"
          "\n"
          "example:\n"
          "  heapprofd -n myapp --continuous-dump 1000 -o /tmp/traces &\n"
          "  LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libheapprof.so myapp\n"
          "\n"
          "exit status: 0 stopped cleanly; 2 usage or configuration error; 3 service failure.\n",
          f);
}

struct daemon_run {
    const struct svc_config *cfg;
    const char *socket_path;
    char output[PATH_MAX]; /* the trace file opened */
    int http_fd;           /* --http: listening, until the endpoint takes it; else -1 */
    char http_url[128];
    http_endpoint_t *http;
    svc_t *svc; /* once started */
};

static void attach_running(void *ctx, const struct svc_proc *p)
{
    struct daemon_run *d = ctx;
    char why[768];
    why[0] = '\0';
    int r = svc_proc_attach_daemon(d->svc, p, d->cfg->allow_other_users, why, sizeof(why));
    if (r == -EAGAIN)
        hp_log_info("pid %d (%s): no wake entry advertised (still starting, or attaching "
                    "disabled); not attached",
                    (int)p->pid, p->name);
    else if (r < 0)
        hp_log_warn("pid %d (%s) %s; not attached", (int)p->pid, p->name,
                    why[0] ? why : strerror(-r));
    else
        hp_log_info("pid %d (%s): woken to attach", (int)p->pid, p->name);
}

/* The name of a HeapprofdConfig field @cfg sets to other than its default, or NULL: in
 * producer mode those come from each session's config. */
static const char *session_field_given(const struct svc_config *cfg)
{
    struct svc_config dflt;
    svc_config_init(&dflt);
    if (cfg->n_pid || cfg->n_process_cmdline)
        return cfg->n_pid ? "pid" : "process_cmdline";
    for (size_t i = 0; i < svc_n_config_fields; i++) {
        const struct svc_config_field *f = &svc_config_fields[i];
        size_t w = f->type == SVC_FIELD_BOOL ? sizeof(bool) : f->width;
        if (f->proto_id &&
            (f->type == SVC_FIELD_BOOL || f->type == SVC_FIELD_UINT ||
             f->type == SVC_FIELD_BYTES) &&
            memcmp((const char *)cfg + f->offset, (const char *)&dflt + f->offset, w) != 0)
            return f->name;
    }
    return NULL;
}

/* No pid file: `heapprof dump` asks the daemon over its socket (svc_control_dump()), so
 * no tool of ours ever signals a pid read from a file. */
static int daemon_started(void *ctx, svc_t *s)
{
    struct daemon_run *d = ctx;
    d->svc = s;
    if (d->cfg->allow_other_users)
        fprintf(stderr,
                "heapprofd: listening on %s, mode 0666 (--allow-other-users): processes of "
                "every user may connect (HEAPPROF_SOCKET=%s); each is checked by its uid and "
                "its /proc descriptors; writing %s\n",
                d->socket_path, d->socket_path, d->output);
    else
        fprintf(stderr, "heapprofd: listening on %s, writing %s\n", d->socket_path, d->output);
    if (d->http_fd >= 0) {
        int r = http_endpoint_start(d->http_fd, s, &d->http);
        d->http_fd = -1;
        if (r < 0) {
            fprintf(stderr, "heapprofd: cannot serve --http: %s\n", strerror(-r));
            return r;
        }
        /* Tests and scripts read the port taken for --http :0 from this line. */
        fprintf(stderr, "heapprofd: serving pprof on %s\n", d->http_url);
    }
    if (!d->cfg->no_running && svc_config_has_targets(d->cfg))
        svc_proc_scan_targets(d->cfg, attach_running, d);
    return 0;
}

static void daemon_stopping(void *ctx, const struct cli_loop_result *res)
{
    struct daemon_run *d = ctx;
    /* Before the final dumps: the endpoint's queries need the bookkeeping thread. */
    d->http = http_endpoint_stop(d->http);
    fprintf(stderr, "heapprofd: stopping (signal %d): dumping every process\n", res->signo);
}

/* What the command line asks for. */
struct daemon_args {
    struct svc_config cfg;
    struct cli_common_opts common; /* -o, --status, --no-status */
    const char *socket_path;       /* NULL: the runtime dir's */
    bool producer;
    const char *producer_socket, *data_source; /* with --producer */
    const char *http;                          /* --http ADDR:PORT, or NULL */
    bool http_allow_remote;
};

/* --config FILE, wherever it is on the command line, under the flags. Returns 0, or
 * -EINVAL after a message. */
static int load_config_file(int argc, char **argv, const struct cli_opts *opts,
                            struct svc_config *cfg)
{
    char err[512];
    int c, r = 0;
    opterr = 0;
    while ((c = getopt_long(argc, argv, opts->shortopts, opts->longopts, NULL)) != -1) {
        if (c == OPT_CONFIG && svc_config_load_file(optarg, cfg, err, sizeof(err)) < 0) {
            fprintf(stderr, "heapprofd: %s\n", err);
            r = -EINVAL;
            break;
        }
    }
    opterr = 1;
    optind = 0;
    return r;
}

/* With --producer, the configuration comes from each tracing session: refuses what would
 * be ignored. Returns 0, or -EINVAL after a message. */
static int check_producer_args(const struct daemon_args *a, bool config_file)
{
    const char *given = session_field_given(&a->cfg);
    if (a->common.output)
        fprintf(stderr, "heapprofd: with --producer, traced writes the trace: no -o\n");
    else if (config_file)
        fprintf(stderr, "heapprofd: with --producer, each tracing session's "
                        "heapprofd_config is the configuration: no --config\n");
    else if (given)
        fprintf(stderr,
                "heapprofd: with --producer, %s comes from each tracing session's "
                "heapprofd_config\n",
                given);
    return a->common.output || config_file || given ? -EINVAL : 0;
}

/* Fills @a from the command line (the config file first, so flags override it wherever
 * they are) and checks it. Returns < 0 after a usage error (message printed), 0 after
 * --help, > 0 to go on. */
static int daemon_parse_args(int argc, char **argv, const struct cli_opts *opts,
                             struct daemon_args *a)
{
    bool config_file = false;
    char err[512];
    int c;
    if (load_config_file(argc, argv, opts, &a->cfg) < 0)
        return -EINVAL;
    while ((c = getopt_long(argc, argv, opts->shortopts, opts->longopts, NULL)) != -1) {
        int r = cli_opts_apply(opts, c, optarg, &a->cfg, "heapprofd");
        if (r == 0)
            r = cli_common_apply(&a->common, c, optarg, "heapprofd");
        if (r < 0)
            return -EINVAL;
        if (r > 0)
            continue;
        switch (c) {
        case OPT_CONFIG:
            config_file = true;
            break;
        case OPT_PRODUCER:
            a->producer = true;
            break;
        case OPT_PRODUCER_SOCKET:
            a->producer_socket = optarg;
            break;
        case OPT_DATA_SOURCE:
            a->data_source = optarg;
            break;
        case OPT_SOCKET:
            a->socket_path = optarg;
            break;
        case OPT_HTTP:
            a->http = optarg;
            break;
        case OPT_HTTP_ALLOW_REMOTE:
            a->http_allow_remote = true;
            break;
        case 'h':
            usage(stdout, opts);
            return 0;
        default:
            usage(stderr, opts);
            return -EINVAL;
        }
    }
    if (optind != argc) {
        fprintf(stderr, "heapprofd: unexpected argument '%s'\n", argv[optind]);
        return -EINVAL;
    }
    if (!a->producer && (a->producer_socket || a->data_source)) {
        fprintf(stderr, "heapprofd: --producer-socket and --data-source need --producer\n");
        return -EINVAL;
    }
    if (a->producer && check_producer_args(a, config_file) < 0)
        return -EINVAL;
    if (a->producer && a->http) {
        fprintf(stderr, "heapprofd: --http serves the daemon's own profiles: not with "
                        "--producer (traced's sessions own theirs)\n");
        return -EINVAL;
    }
    if (a->http_allow_remote && !a->http) {
        fprintf(stderr, "heapprofd: --http-allow-remote needs --http\n");
        return -EINVAL;
    }
    if (svc_config_check(&a->cfg, err, sizeof(err)) < 0) {
        fprintf(stderr, "heapprofd: %s\n", err);
        return -EINVAL;
    }
    if (!a->producer && !svc_config_has_targets(&a->cfg))
        fprintf(stderr, "heapprofd: no targets (-p, -n, --all, or pid/process_cmdline in the "
                        "config): processes that connect are left unprofiled\n");
    if (a->cfg.allow_other_users && geteuid() != 0) {
        fprintf(stderr, "heapprofd: --allow-other-users needs root (only root may profile "
                        "processes of other users)\n");
        return -EINVAL;
    }
    return 1;
}

/* The default socket: in our runtime dir, or with --allow-other-users in the shared one
 * (the runtime dir is ours alone, mode 0700: other users' processes could not reach a
 * socket in it). Returns 0, or EXIT_PROFILER after a message. */
static int default_socket_path(bool allow_other_users, char *sock, size_t len)
{
    char dir[HP_PATH_MAX], err[512];
    if (hp_runtime_dir_prepare(dir, sizeof(dir), err, sizeof(err)) < 0) {
        fprintf(stderr, "heapprofd: %s\n", err);
        return EXIT_PROFILER;
    }
    snprintf(sock, len, "%s/%s", dir, HP_DAEMON_SOCKET_NAME);
    if (allow_other_users) {
        if (hp_shared_dir_prepare(dir, sizeof(dir), err, sizeof(err)) < 0) {
            fprintf(stderr, "heapprofd: %s (or give --socket PATH)\n", err);
            return EXIT_PROFILER;
        }
        snprintf(sock, len, "%s/%s", dir, HP_DAEMON_SOCKET_NAME);
    }
    return 0;
}

/* -o FILE|DIR: a directory, or none, gets a name of ours, "heapprofd-<date>-<pid>.pftrace"
 * (in it). Returns the name, in @buf when made up; @ret_made_up says which. */
static const char *output_name(const char *output, char *buf, size_t len, bool *ret_made_up)
{
    struct stat st;
    *ret_made_up = !output || (stat(output, &st) == 0 && S_ISDIR(st.st_mode));
    if (!*ret_made_up)
        return output;
    char ts[32];
    time_t now = time(NULL);
    struct tm tm;
    strftime(ts, sizeof(ts), "%Y%m%d-%H%M%S", localtime_r(&now, &tm));
    size_t dl = output ? strlen(output) : 0;
    while (dl > 1 && output[dl - 1] == '/')
        dl--;
    snprintf(buf, len, "%.*s%sheapprofd-%s-%d.pftrace", (int)dl, output ? output : "",
             output ? "/" : "", ts, (int)getpid());
    return buf;
}

/* Serves until SIGINT/SIGTERM: as a data source of traced, or writing a trace file.
 * Returns the exit status. */
static int daemon_run(struct daemon_args *a)
{
    struct svc_config *cfg = &a->cfg;
    char sock[HP_PATH_MAX + 32];
    const char *socket_path = a->socket_path;
    if (!socket_path) {
        int rc = default_socket_path(cfg->allow_other_users, sock, sizeof(sock));
        if (rc)
            return rc;
        socket_path = sock;
    }
    cfg->socket_path = socket_path;
    /* The daemon's log: a line per process connected, ended or dropped. */
    cfg->log_processes = true;
    if (a->producer)
        return cli_producer_run(&(struct cli_producer_opts){.base = cfg,
                                                            .daemon_socket = socket_path,
                                                            .producer_socket = a->producer_socket,
                                                            .data_source = a->data_source});

    char out_buf[PATH_MAX];
    bool made_up;
    const char *output = output_name(a->common.output, out_buf, sizeof(out_buf), &made_up);
    struct daemon_run d = {.cfg = cfg, .socket_path = socket_path, .http_fd = -1};
    if (a->http) {
        char err[512];
        int r = http_listen(a->http, a->http_allow_remote, &d.http_fd, d.http_url,
                            sizeof(d.http_url), err, sizeof(err));
        if (r < 0) {
            fprintf(stderr, "heapprofd: --http %s\n", err);
            return r == -EPERM || r == -EINVAL ? EXIT_USAGE : EXIT_PROFILER;
        }
    }
    struct cli_session cs = {
        .prog = "heapprofd",
        .cfg = cfg,
        .output = output,
        .output_made_up = made_up,
        .output_opened = d.output,
        .top = 0,
        .loop = {.status_line = a->common.status_line && isatty(STDERR_FILENO)},
        .started = daemon_started,
        .stopping = daemon_stopping,
        .ctx = &d,
    };
    struct cli_loop_result res;
    int rc = cli_session_run(&cs, &res);
    d.http = http_endpoint_stop(d.http);
    if (d.http_fd >= 0)
        (void)close(d.http_fd);
    return rc;
}

int cmd_daemon(int argc, char **argv)
{
    struct cli_opts opts;
    struct daemon_args a = {.common = {.status_line = true /* on a terminal */}};
    svc_config_init(&a.cfg);
    daemon_fields_init();
    if (cli_opts_build(&opts, daemon_own_opts, "o:h", daemon_fields) < 0)
        return EXIT_PROFILER;
    int r = daemon_parse_args(argc, argv, &opts, &a);
    cli_opts_done(&opts);
    if (r > 0)
        cli_set_inject_library();
    int rc = r < 0 ? EXIT_USAGE : r == 0 ? 0 : daemon_run(&a);
    svc_config_done(&a.cfg);
    return rc;
}

int main(int argc, char **argv)
{
    return cmd_daemon(argc, argv);
}
