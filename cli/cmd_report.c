/* cli/cmd_report.c: `heapprof report` (the text report of a trace) and `heapprof pprof`
 * (its dumps as pprof profiles), both on report/. */
#include "cli/cli.h"

#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "report/report.h"

/* "cannot read FILE: why", the one line for a trace that cannot be read. */
static void load_error(const char *prog, const char *path, int r)
{
    fprintf(stderr, "%s: cannot read %s: %s\n", prog, path,
            r == -EBADMSG ? "not a valid trace file"
            : r == -EFBIG ? "it asks for more memory than a trace of its size may (a damaged "
                            "or hostile trace)"
                          : strerror(-r));
}

/* The trace ends inside a packet or a dump: say where and what was read. */
static void truncation_error(const char *prog, const char *path, const struct rp_trace *t)
{
    uint64_t dumps = 0;
    for (size_t i = 0; i < t->n_processes; i++)
        dumps += t->processes[i].n_dumps;
    if (t->incomplete_dumps)
        fprintf(stderr,
                "%s: %s is truncated: it ends inside a dump (%" PRIu32
                " incomplete, dropped); shown: the %" PRIu64 " complete dumps in %" PRIu64
                " packets before it\n",
                prog, path, t->incomplete_dumps, dumps, t->n_packets);
    else
        fprintf(stderr,
                "%s: %s is truncated: it ends inside a packet at byte %" PRIu64 " of %" PRIu64
                "; shown: the %" PRIu64 " complete dumps in %" PRIu64 " packets before it\n",
                prog, path, t->truncated_at, t->file_bytes, dumps, t->n_packets);
}

/* The program of the first profiled process: argv[0]'s base name. */
static void program_of(const struct rp_trace *t, char *buf, size_t len)
{
    buf[0] = '\0';
    for (size_t i = 0; i < t->n_processes; i++) {
        const char *cmd = t->processes[i].cmdline;
        if (!cmd || !cmd[0] || !t->processes[i].n_dumps)
            continue;
        size_t n = strcspn(cmd, " ");
        const char *slash = memrchr(cmd, '/', n);
        const char *base = slash ? slash + 1 : cmd;
        snprintf(buf, len, "%.*s", (int)(n - (size_t)(base - cmd)), base);
        return;
    }
}

static const struct option report_opts[] = {
    {"top", required_argument, NULL, 'n'},     {"dump", required_argument, NULL, 'd'},
    {"no-demangle", no_argument, NULL, 'D'},   {"no-stacks", no_argument, NULL, 'S'},
    {"help", no_argument, NULL, 'h'},          {"process", required_argument, NULL, 'p'},
    {"diff", required_argument, NULL, 'B'},    {"base-dump", required_argument, NULL, 'b'},
    {"growth", no_argument, NULL, 'G'},        {"no-lines", no_argument, NULL, 'L'},
    {"pid", required_argument, NULL, 'p'},     {"hide", required_argument, NULL, 'H'},
    {"focus", required_argument, NULL, 'F'},   {"fold", required_argument, NULL, 'W'},
    {"no-fold", no_argument, NULL, 'w'},       {"full-stacks", no_argument, NULL, 'U'},
    {"all-processes", no_argument, NULL, 'A'}, {"folded", no_argument, NULL, 'f'},
    {"value", required_argument, NULL, 'v'},   {0},
};

static void usage_report(FILE *f)
{
    fputs("usage: heapprof report FILE [options]\n"
          "\n"
          "Prints a summary (peak, totals, a table of processes, the functions holding\n"
          "the most memory, flat and cumulative), then, per process, the call sites\n"
          "holding the most unreleased memory and the ones that allocated most, with\n"
          "their stacks, and the trace's statistics.\n"
          "\n"
          "Counts are estimates of real allocations from the sampled ones (the number\n"
          "sampled beside them), and '±' is one standard deviation of an estimate under\n"
          "the sampling model. Frames show function and file:line when the trace has\n"
          "source lines, inlined functions included; else module+offset.\n"
          "\n"
          "options:\n"
          "  -n, --top N        sites per table (default 10)\n"
          "      --dump N       use the Nth dump of each process (default: the last)\n"
          "      --process PID  only this process (every program it ran; or --pid)\n"
          "      --growth       over the dumps of each process (continuous dumps):\n"
          "                     unreleased bytes per dump as a chart, and the sites\n"
          "                     ranked by how steadily their unreleased bytes grow\n"
          "      --diff BASE    print the growth per site since the trace BASE (or, with\n"
          "                     --base-dump M and BASE = FILE, since dump M of FILE)\n"
          "      --base-dump M  the dump of BASE to compare with (default: the last)\n"
          "      --no-demangle  print C++ names as stored\n"
          "      --no-stacks    one line per site\n"
          "      --no-lines     frames as module+offset, without source lines\n"
          "      --all-processes  sites of every process (default: of the 3 with the\n"
          "                     most unreleased bytes)\n"
          "      --folded       folded stacks (root;...;site VALUE) for flamegraph.pl,\n"
          "                     inferno or speedscope, instead of the report\n"
          "      --value V      with --folded: unreleased (default), allocated,\n"
          "                     unreleased-count or allocated-count\n"
          "\n"
          "stacks (every view; RE: POSIX extended regular expression on demangled names):\n"
          "      --hide RE      remove matching frames (their callees merge into the caller)\n"
          "      --focus RE     keep only stacks with a matching frame\n"
          "      --fold RE      fold matching frames at the leaf into their callers, as the\n"
          "                     allocator wrappers are (operator new, malloc, alloc::, ...)\n"
          "      --no-fold      keep the allocator wrappers' frames\n"
          "      --full-stacks  keep the frames below main and thread entry points\n"
          "  -h, --help         this help\n"
          "\n"
          "Exit status: 0; 1 when the trace cannot be read, is truncated (what was read\n"
          "is printed first), holds no dump or process asked for, or a pattern is bad;\n"
          "2 usage error.\n"
          "\n"
          "example:\n"
          "  heapprof report heapprof-myapp-1234.pftrace --top 5\n"
          "  heapprof report --growth daemon-trace.pftrace\n"
          "  heapprof report after.pftrace --diff before.pftrace\n"
          "  heapprof report --folded app.pftrace | flamegraph.pl > app.svg\n"
          "  heapprof report app.pftrace --hide '^zmalloc$' --focus '^handle_request$'\n",
          f);
}

static const struct option pprof_opts[] = {
    {"output", required_argument, NULL, 'o'},  {"dump", required_argument, NULL, 'd'},
    {"process", required_argument, NULL, 'p'}, {"help", no_argument, NULL, 'h'},
    {"hide", required_argument, NULL, 'H'},    {"focus", required_argument, NULL, 'F'},
    {"fold", required_argument, NULL, 'W'},    {0},
};

static void usage_pprof(FILE *f)
{
    fputs("usage: heapprof pprof FILE [options]\n"
          "\n"
          "Writes each dump of each process and heap of a trace as a gzipped pprof profile\n"
          "(sample types alloc_objects, alloc_space, inuse_objects, inuse_space) named\n"
          "OUT.pid<PID>.<heap>.dump<N>.pb.gz, or OUT itself if it ends in .pb.gz and one\n"
          "profile is selected. Prints the names of the files written.\n"
          "\n"
          "options:\n"
          "  -o, --output OUT   output name or prefix (default: FILE without .pftrace)\n"
          "      --dump N       only the Nth dump of each process\n"
          "      --process PID  only this process\n"
          "      --hide RE      remove matching frames (as in 'heapprof report')\n"
          "      --focus RE     keep only stacks with a matching frame\n"
          "      --fold RE      fold matching frames at the leaf into their callers\n"
          "                     (the profiles keep every frame otherwise: no wrapper is\n"
          "                     folded and nothing is cut below main)\n"
          "  -h, --help         this help\n"
          "\n"
          "example:\n"
          "  heapprof pprof app.pftrace -o app && go tool pprof "
          "app.pid1234.libc.malloc.dump1.pb.gz\n",
          f);
}

/* Processes whose sites are shown in detail, unless --all-processes or --process. */
#define REPORT_DETAIL_PROCESSES 3

/* What `heapprof report`'s command line asks for. */
struct report_args {
    struct rp_report_options ro;
    struct rp_trace_options to, base_to; /* the trace's selection, the base's */
    const char *path, *base_path;        /* base_path: NULL without --diff */
    bool growth, all_processes, folded;
    enum rp_folded_value value;
    /* --hide, --focus, --fold: point into argv, room for argc each */
    struct rp_filter_options fo;
    const char **hide, **focus, **fold;
};

/* Takes option @c (argument in optarg) of the stack filters and the folded view into
 * @a. Returns 1, 0 for an option it does not know, < 0 after a message. */
static int report_parse_view(int c, struct report_args *a)
{
    switch (c) {
    case 'H':
        a->hide[a->fo.n_hide++] = optarg;
        break;
    case 'F':
        a->focus[a->fo.n_focus++] = optarg;
        break;
    case 'W':
        a->fold[a->fo.n_fold++] = optarg;
        break;
    case 'w':
        a->fo.no_fold = true;
        break;
    case 'U':
        a->fo.full_stacks = true;
        break;
    case 'A':
        a->all_processes = true;
        break;
    case 'f':
        a->folded = true;
        break;
    case 'v':
        if (rp_folded_value_parse(optarg, &a->value) < 0) {
            fprintf(stderr,
                    "heapprof report: --value wants unreleased, allocated, "
                    "unreleased-count or allocated-count, not '%s'\n",
                    optarg);
            return -EINVAL;
        }
        break;
    default:
        return 0;
    }
    return 1;
}

/* Fills @a from the command line and checks it. Returns < 0 after a usage error (message
 * printed), 0 after --help, > 0 to go on. */
static int report_parse_args(int argc, char **argv, struct report_args *a)
{
    uint64_t v;
    int c, r;
    while ((c = getopt_long(argc, argv, "n:h", report_opts, NULL)) != -1) {
        switch (c) {
        case 'n':
            if (cli_parse_range(optarg, 1, 100000, &v) < 0) {
                fprintf(stderr, "heapprof report: --top wants a number >= 1, not '%s'\n", optarg);
                return -EINVAL;
            }
            a->ro.top_n = (int)v;
            break;
        case 'd':
            if (cli_parse_range(optarg, 1, INT_MAX, &v) < 0) {
                fprintf(stderr, "heapprof report: --dump wants a number >= 1, not '%s'\n", optarg);
                return -EINVAL;
            }
            a->to.dump_index = (int)v;
            break;
        case 'b':
            if (cli_parse_range(optarg, 1, INT_MAX, &v) < 0) {
                fprintf(stderr, "heapprof report: --base-dump wants a number >= 1, not '%s'\n",
                        optarg);
                return -EINVAL;
            }
            a->base_to.dump_index = (int)v;
            break;
        case 'p':
            if (cli_parse_range(optarg, 1, INT32_MAX, &v) < 0) {
                fprintf(stderr, "heapprof report: --process wants a pid, not '%s'\n", optarg);
                return -EINVAL;
            }
            a->to.pid = a->base_to.pid = (int32_t)v;
            break;
        case 'B':
            a->base_path = optarg;
            break;
        case 'D':
            a->ro.demangle = false;
            break;
        case 'S':
            a->ro.no_stacks = true;
            break;
        case 'G':
            a->growth = true;
            break;
        case 'L':
            a->ro.no_lines = true;
            break;
        case 'h':
            usage_report(stdout);
            return 0;
        default:
            r = report_parse_view(c, a);
            if (r <= 0) {
                if (r == 0)
                    usage_report(stderr);
                return -EINVAL;
            }
        }
    }
    if (optind != argc - 1) {
        fprintf(stderr, "heapprof report: expected one trace file\n");
        usage_report(stderr);
        return -EINVAL;
    }
    a->path = argv[optind];
    if (a->growth && (a->base_path || a->to.dump_index)) {
        fprintf(stderr, "heapprof report: --growth uses every dump; it goes with neither "
                        "--diff nor --dump\n");
        return -EINVAL;
    }
    if (a->folded && (a->growth || a->base_path)) {
        fprintf(stderr, "heapprof report: --folded prints one dump; it goes with neither "
                        "--growth nor --diff\n");
        return -EINVAL;
    }
    a->to.all_dumps = a->growth;
    a->fo.hide = a->hide;
    a->fo.focus = a->focus;
    a->fo.fold = a->fold;
    a->ro.focused = a->fo.n_focus > 0;
    if (!a->all_processes && !a->to.pid)
        a->ro.max_processes = REPORT_DETAIL_PROCESSES;
    return 1;
}

/* The most dumps any process of @t has. */
static uint32_t max_dumps(const struct rp_trace *t)
{
    uint32_t max = 0;
    for (size_t i = 0; i < t->n_processes; i++)
        max = HP_MAX(max, t->processes[i].n_dumps);
    return max;
}

/* Whether @t has what @to selects: false after a message. */
static bool has_selection(const char *path, const struct rp_trace *t,
                          const struct rp_trace_options *to)
{
    uint32_t max = max_dumps(t);
    if (to->pid && t->n_processes == 0) {
        fprintf(stderr, "heapprof report: %s has no process with pid %d\n", path, (int)to->pid);
        return false;
    }
    if (to->dump_index && (uint32_t)to->dump_index > max) {
        fprintf(stderr,
                "heapprof report: %s has no dump %d: its processes have at most %" PRIu32
                " dump%s\n",
                path, to->dump_index, max, max == 1 ? "" : "s");
        return false;
    }
    return true;
}

/* Prints the growth per site from the base trace to @t. Returns < 0 when nothing was
 * printed (the base cannot be read or lacks the dump asked for; message given), else 1
 * when the base is truncated (message given) and 0 when not. */
static int report_diff(const struct report_args *a, const struct rp_trace *t, rp_filter_t *f)
{
    struct rp_trace_options base_to = a->base_to;
    struct rp_trace *base;
    /* Pids differ between two runs: the base keeps every process when the selection is
     * by pid and the base has no such pid. */
    int r = rp_trace_load(a->base_path, &base_to, &base);
    if (r == 0 && base_to.pid && base->n_processes == 0) {
        base = rp_trace_free(base);
        base_to.pid = 0;
        r = rp_trace_load(a->base_path, &base_to, &base);
    }
    if (r == 0 && (r = rp_trace_filter(base, f)) < 0)
        base = rp_trace_free(base);
    if (r < 0) {
        load_error("heapprof report", a->base_path, r);
        return r;
    }
    uint32_t base_max = max_dumps(base);
    if (base_to.dump_index && (uint32_t)base_to.dump_index > base_max) {
        fprintf(stderr,
                "heapprof report: %s has no dump %d: its processes have at most %" PRIu32
                " dump%s\n",
                a->base_path, base_to.dump_index, base_max, base_max == 1 ? "" : "s");
        rp_trace_free(base);
        return -ENODATA;
    }
    char pa[256], pb[256];
    program_of(base, pa, sizeof(pa));
    program_of(t, pb, sizeof(pb));
    if (pa[0] && pb[0] && strcmp(pa, pb) != 0)
        fprintf(stderr,
                "heapprof report: warning: %s profiles '%s' but %s profiles '%s': the sites of "
                "different programs rarely match\n",
                a->base_path, pa, a->path, pb);
    rp_report_print_diff(stdout, base, t, &a->ro);
    int rc = 0;
    if (base->truncated) {
        truncation_error("heapprof report", a->base_path, base);
        rc = 1;
    }
    rp_trace_free(base);
    return rc;
}

/* Prints the report the arguments ask for with filter @f. Returns the exit status. */
static int report_run_filtered(const struct report_args *a, rp_filter_t *f)
{
    struct rp_trace *t;
    int r = rp_trace_load(a->path, &a->to, &t);
    if (r == 0 && (r = rp_trace_filter(t, f)) < 0)
        t = rp_trace_free(t);
    if (r < 0) {
        load_error("heapprof report", a->path, r);
        return 1;
    }
    int rc = 0;
    if (!has_selection(a->path, t, &a->to)) {
        rc = 1;
    } else if (a->base_path) {
        rc = report_diff(a, t, f);
        if (rc < 0) {
            rp_trace_free(t);
            return 1;
        }
    } else if (a->folded) {
        if (rp_report_print_folded(stdout, t, a->value, &a->ro) < 0) {
            fprintf(stderr, "heapprof report: out of memory\n");
            rc = 1;
        }
    } else if (a->growth) {
        rp_report_print_growth(stdout, t, &a->ro);
    } else {
        rp_report_print(stdout, t, &a->ro);
    }
    if (t->truncated) {
        fflush(stdout);
        truncation_error("heapprof report", a->path, t);
        rc = 1;
    }
    rp_trace_free(t);
    return rc;
}

/* Prints the report the arguments ask for. Returns the exit status. */
static int report_run(const struct report_args *a)
{
    char err[512];
    rp_filter_t *f = rp_filter_new(&a->fo, err, sizeof(err));
    if (!f) {
        fprintf(stderr, "heapprof report: %s\n", err);
        return 1;
    }
    int rc = report_run_filtered(a, f);
    rp_filter_free(f);
    return rc;
}

int cmd_report(int argc, char **argv)
{
    struct report_args a = {.ro = {.top_n = 10, .demangle = true, .summary = true}};
    /* Each of --hide, --focus and --fold has room for every argument. */
    const char **pats = calloc(3 * (size_t)argc + 3, sizeof(*pats));
    if (!pats) {
        fprintf(stderr, "heapprof report: out of memory\n");
        return 1;
    }
    a.hide = pats;
    a.focus = pats + argc + 1;
    a.fold = pats + 2 * (size_t)argc + 2;
    int r = report_parse_args(argc, argv, &a);
    r = r < 0 ? EXIT_USAGE : r == 0 ? 0 : report_run(&a);
    free(pats);
    return r;
}

/* What `heapprof pprof`'s command line asks for. */
struct pprof_args {
    const char *path, *out; /* out: NULL for the trace's name without .pftrace */
    int dump;               /* 0: every dump */
    int32_t pid;            /* 0: every process */
    /* --hide, --focus, --fold: point into argv, room for argc each */
    struct rp_filter_options fo;
    const char **hide, **focus, **fold;
};

/* Fills @a from the command line. Returns < 0 after a usage error (message printed), 0
 * after --help, > 0 to go on. */
static int pprof_parse_args(int argc, char **argv, struct pprof_args *a)
{
    uint64_t v;
    int c;
    while ((c = getopt_long(argc, argv, "o:h", pprof_opts, NULL)) != -1) {
        switch (c) {
        case 'o':
            a->out = optarg;
            break;
        case 'd':
            if (cli_parse_range(optarg, 1, INT_MAX, &v) < 0) {
                fprintf(stderr, "heapprof pprof: --dump wants a number >= 1, not '%s'\n", optarg);
                return -EINVAL;
            }
            a->dump = (int)v;
            break;
        case 'p':
            if (cli_parse_range(optarg, 1, INT32_MAX, &v) < 0) {
                fprintf(stderr, "heapprof pprof: --process wants a pid, not '%s'\n", optarg);
                return -EINVAL;
            }
            a->pid = (int32_t)v;
            break;
        case 'H':
            a->hide[a->fo.n_hide++] = optarg;
            break;
        case 'F':
            a->focus[a->fo.n_focus++] = optarg;
            break;
        case 'W':
            a->fold[a->fo.n_fold++] = optarg;
            break;
        case 'h':
            usage_pprof(stdout);
            return 0;
        default:
            usage_pprof(stderr);
            return -EINVAL;
        }
    }
    if (optind != argc - 1) {
        fprintf(stderr, "heapprof pprof: expected one trace file\n");
        usage_pprof(stderr);
        return -EINVAL;
    }
    a->path = argv[optind];
    return 1;
}

/* Exports what @a asks for with filter @f (NULL: none). Returns the exit status. */
static int pprof_run(const struct pprof_args *a, rp_filter_t *f)
{
    const char *path = a->path, *out = a->out;
    char prefix[PATH_MAX];
    if (!out) {
        size_t n = strlen(path);
        if (n > 8 && !strcmp(path + n - 8, ".pftrace"))
            n -= 8;
        snprintf(prefix, sizeof(prefix), "%.*s", (int)n, path);
        out = prefix;
    }
    bool truncated = false;
    int r = rp_pprof_export_filtered(path, out, a->dump, a->pid, f, stdout, &truncated);
    if (r == -ENODATA) {
        fprintf(stderr, "heapprof pprof: %s: no dump matches%s\n", path,
                a->pid ? " (check --process and --dump with 'heapprof report')" : "");
        return 1;
    }
    if (r < 0) {
        load_error("heapprof pprof", path, r);
        return 1;
    }
    if (truncated) {
        fprintf(stderr, "heapprof pprof: %s is truncated: its complete dumps were exported\n",
                path);
        return 1;
    }
    return 0;
}

int cmd_pprof(int argc, char **argv)
{
    /* A profile keeps its stacks whole unless asked: pprof has its own views. */
    struct pprof_args a = {.fo = {.no_fold = true, .full_stacks = true}};
    const char **pats = calloc(3 * (size_t)argc + 3, sizeof(*pats));
    if (!pats) {
        fprintf(stderr, "heapprof pprof: out of memory\n");
        return 1;
    }
    a.hide = pats;
    a.focus = pats + argc + 1;
    a.fold = pats + 2 * (size_t)argc + 2;
    a.fo.hide = a.hide;
    a.fo.focus = a.focus;
    a.fo.fold = a.fold;
    int r = pprof_parse_args(argc, argv, &a);
    if (r <= 0) {
        free(pats);
        return r < 0 ? EXIT_USAGE : 0;
    }
    rp_filter_t *f = NULL;
    if (a.fo.n_hide || a.fo.n_focus || a.fo.n_fold) {
        char err[512];
        f = rp_filter_new(&a.fo, err, sizeof(err));
        if (!f) {
            fprintf(stderr, "heapprof pprof: %s\n", err);
            free(pats);
            return 1;
        }
    }
    r = pprof_run(&a, f);
    rp_filter_free(f);
    free(pats);
    return r;
}
