/* cli/cmd_html.c: `heapprof html`: a trace as one self-contained HTML page (report/html.c):
 * summary, flame graphs, heap over time, growth ranking, and the growth since a base. */
#include "cli/cli.h"

#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "report/report.h"

#define PROG "heapprof html"

static const struct option html_opts[] = {
    {"output", required_argument, NULL, 'o'}, {"diff", required_argument, NULL, 'B'},
    {"pid", required_argument, NULL, 'p'},    {"process", required_argument, NULL, 'p'},
    {"dump", required_argument, NULL, 'd'},   {"no-demangle", no_argument, NULL, 'D'},
    {"help", no_argument, NULL, 'h'},         {0},
};

static void usage_html(FILE *f)
{
    fputs("usage: heapprof html TRACE [options]\n"
          "\n"
          "Writes the trace as one self-contained HTML page (no network; opens from disk):\n"
          "a summary per process (peak heap and when, unreleased, allocated, samples,\n"
          "drops, flags), a flame graph per process and dump (unreleased or allocated,\n"
          "bytes or counts; click to zoom, search, hide and focus by regular expression,\n"
          "allocator wrappers folded), and with several dumps the heap over time and the\n"
          "sites ranked by growth (as 'heapprof report --growth').\n"
          "\n"
          "options:\n"
          "  -o, --output OUT   the page (default: TRACE with .html for its extension;\n"
          "                     '-' for standard output)\n"
          "      --diff BASE    add the growth per site since the trace BASE\n"
          "      --pid PID      only this process (every program it ran)\n"
          "      --dump N       the dump shown first (default: the last)\n"
          "      --no-demangle  C++ names as stored\n"
          "  -h, --help         this help\n"
          "\n"
          "Exit status: 0; 1 when a trace cannot be read or is truncated (the page shows\n"
          "what was read), the output cannot be written, or nothing matches --pid or\n"
          "--dump; 2 usage error.\n"
          "\n"
          "example:\n"
          "  heapprof html app.pftrace && xdg-open app.html\n"
          "  heapprof html after.pftrace --diff before.pftrace -o growth.html\n",
          f);
}

struct html_args {
    const char *path, *base_path, *out; /* base_path, out: NULL when not given */
    int32_t pid;
    int dump;
    bool demangle;
};

/* Fills @a from the command line. Returns < 0 after a usage error (message printed), 0
 * after --help, > 0 to go on. */
static int html_parse_args(int argc, char **argv, struct html_args *a)
{
    uint64_t v;
    int c;
    while ((c = getopt_long(argc, argv, "o:h", html_opts, NULL)) != -1) {
        switch (c) {
        case 'o':
            a->out = optarg;
            break;
        case 'B':
            a->base_path = optarg;
            break;
        case 'p':
            if (cli_parse_range(optarg, 1, INT32_MAX, &v) < 0) {
                fprintf(stderr, PROG ": --pid wants a pid, not '%s'\n", optarg);
                return -EINVAL;
            }
            a->pid = (int32_t)v;
            break;
        case 'd':
            if (cli_parse_range(optarg, 1, INT_MAX, &v) < 0) {
                fprintf(stderr, PROG ": --dump wants a number >= 1, not '%s'\n", optarg);
                return -EINVAL;
            }
            a->dump = (int)v;
            break;
        case 'D':
            a->demangle = false;
            break;
        case 'h':
            usage_html(stdout);
            return 0;
        default:
            usage_html(stderr);
            return -EINVAL;
        }
    }
    if (optind != argc - 1) {
        fprintf(stderr, PROG ": expected one trace file\n");
        usage_html(stderr);
        return -EINVAL;
    }
    a->path = argv[optind];
    return 1;
}

static int load(const char *path, const struct rp_trace_options *to, struct rp_trace **ret)
{
    int r = rp_trace_load(path, to, ret);
    if (r < 0)
        fprintf(stderr, PROG ": cannot read %s: %s\n", path,
                r == -EBADMSG ? "not a valid trace file"
                : r == -EFBIG ? "it asks for more memory than a trace of its size may (a "
                                "damaged or hostile trace)"
                              : strerror(-r));
    return r;
}

/* Loads the trace and checks it has what the arguments select. */
static int load_trace(const struct html_args *a, struct rp_trace **ret)
{
    struct rp_trace_options to = {.dump_index = a->dump, .pid = a->pid, .all_dumps = true};
    struct rp_trace *t;
    if (load(a->path, &to, &t) < 0)
        return -1;
    uint32_t max = 0;
    for (size_t i = 0; i < t->n_processes; i++)
        max = HP_MAX(max, t->processes[i].n_dumps);
    if (a->pid && t->n_processes == 0) {
        fprintf(stderr, PROG ": %s has no process with pid %d\n", a->path, (int)a->pid);
    } else if (a->dump && (uint32_t)a->dump > max) {
        fprintf(stderr, PROG ": %s has no dump %d: its processes have at most %" PRIu32 " dump%s\n",
                a->path, a->dump, max, max == 1 ? "" : "s");
    } else {
        *ret = t;
        return 0;
    }
    rp_trace_free(t);
    return -1;
}

/* Loads the base: its selected dumps, of the same pid when it has it (two runs of a
 * program have different pids: then every process, matched as `report --diff` does). */
static int load_base(const struct html_args *a, struct rp_trace **ret)
{
    struct rp_trace_options to = {.pid = a->pid};
    if (load(a->base_path, &to, ret) < 0)
        return -1;
    if (a->pid && (*ret)->n_processes == 0) {
        *ret = rp_trace_free(*ret);
        to.pid = 0;
        if (load(a->base_path, &to, ret) < 0)
            return -1;
    }
    return 0;
}

/* The default output: @path with ".html" for its extension. */
static void default_output(const char *path, char *buf, size_t len)
{
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    const char *dot = strrchr(base, '.');
    size_t n = dot && dot != base ? (size_t)(dot - path) : strlen(path);
    snprintf(buf, len, "%.*s.html", (int)n, path);
}

/* Writes the page to @out through a temporary file renamed over it, so that a failed
 * write leaves no half page. Returns the stacks written or -errno (message printed). */
static int write_page(const char *out, const struct rp_trace *t, const struct rp_trace *base,
                      const struct rp_html_options *ho)
{
    if (!strcmp(out, "-")) {
        int r = rp_html_write(stdout, t, base, ho);
        if (r >= 0 && fflush(stdout) != 0)
            r = -errno;
        if (r < 0)
            fprintf(stderr, PROG ": cannot write the page: %s\n", strerror(-r));
        return r;
    }
    char tmp[PATH_MAX];
    if (snprintf(tmp, sizeof(tmp), "%s.XXXXXX", out) >= (int)sizeof(tmp)) {
        fprintf(stderr, PROG ": cannot write %s: %s\n", out, strerror(ENAMETOOLONG));
        return -ENAMETOOLONG;
    }
    int fd = mkostemp(tmp, O_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        fprintf(stderr, PROG ": cannot write %s: %s\n", out, strerror(e));
        return -e;
    }
    mode_t mask = umask(0);
    umask(mask);
    (void)fchmod(fd, 0666 & ~mask);
    FILE *f = fdopen(fd, "w");
    int r = f ? rp_html_write(f, t, base, ho) : -errno;
    if (!f)
        (void)close(fd);
    else if (fclose(f) != 0 && r >= 0)
        r = -errno;
    if (r >= 0 && rename(tmp, out) < 0)
        r = -errno;
    if (r < 0) {
        (void)unlink(tmp);
        fprintf(stderr, PROG ": cannot write %s: %s\n", out, strerror(-r));
    }
    return r;
}

static int html_run(const struct html_args *a)
{
    char out[PATH_MAX];
    if (a->out)
        snprintf(out, sizeof(out), "%s", a->out);
    else
        default_output(a->path, out, sizeof(out));
    if (!strcmp(out, a->path) || (a->base_path && !strcmp(out, a->base_path))) {
        fprintf(stderr, PROG ": %s is a trace read: not overwriting it (use -o)\n", out);
        return 1;
    }
    struct rp_trace *t = NULL, *base = NULL;
    if (load_trace(a, &t) < 0)
        return 1;
    if (a->base_path && load_base(a, &base) < 0) {
        rp_trace_free(t);
        return 1;
    }
    struct rp_html_options ho = {.demangle = a->demangle,
                                 .dump_index = a->dump,
                                 .title = a->path,
                                 .base_title = a->base_path};
    int r = write_page(out, t, base, &ho);
    int rc = r < 0 ? 1 : 0;
    struct stat sb;
    if (r >= 0 && strcmp(out, "-") != 0 && stat(out, &sb) == 0)
        printf("wrote %s (%lld KiB, %d stacks)\n", out, (long long)(sb.st_size + 1023) / 1024, r);
    for (int k = 0; k < 2 && rc == 0; k++) {
        const struct rp_trace *x = k ? base : t;
        if (x && x->truncated) {
            fprintf(stderr,
                    PROG ": %s is truncated: the page shows the complete dumps before its end\n",
                    k ? a->base_path : a->path);
            rc = 1;
        }
    }
    rp_trace_free(base);
    rp_trace_free(t);
    return rc;
}

int cmd_html(int argc, char **argv)
{
    struct html_args a = {.demangle = true};
    int r = html_parse_args(argc, argv, &a);
    return r < 0 ? EXIT_USAGE : r == 0 ? 0 : html_run(&a);
}
