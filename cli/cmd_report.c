/* cli/cmd_report.c: `heapprof report` (the text report of a trace) and `heapprof pprof`
 * (its dumps as pprof profiles), both on report/. */
#include "cli/cli.h"

#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "report/report.h"

static void usage_report(FILE *f)
{
    fputs("usage: heapprof report FILE [options]\n"
          "\n"
          "Prints, per process, the call sites holding the most unreleased memory and the\n"
          "ones that allocated most, with full stacks, and the trace's statistics.\n"
          "\n"
          "options:\n"
          "  -n, --top N        sites per table (default 10)\n"
          "      --dump N       use the Nth dump of each process (default: the last)\n"
          "      --process PID  only this process\n"
          "      --diff BASE    print the growth per site since the trace BASE (or, with\n"
          "                     --base-dump M and BASE = FILE, since dump M of FILE)\n"
          "      --base-dump M  the dump of BASE to compare with (default: the last)\n"
          "      --no-demangle  print C++ names as stored\n"
          "      --no-stacks    one line per site\n"
          "  -h, --help         this help\n"
          "\n"
          "example:\n"
          "  heapprof report heapprof-myapp-1234.pftrace --top 5\n"
          "  heapprof report after.pftrace --diff before.pftrace\n",
          f);
}

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
          "  -h, --help         this help\n"
          "\n"
          "example:\n"
          "  heapprof pprof app.pftrace -o app && go tool pprof "
          "app.pid1234.libc.malloc.dump1.pb.gz\n",
          f);
}

int cmd_report(int argc, char **argv)
{
    static const struct option opts[] = {
        {"top", required_argument, NULL, 'n'},
        {"dump", required_argument, NULL, 'd'},
        {"no-demangle", no_argument, NULL, 'D'},
        {"no-stacks", no_argument, NULL, 'S'},
        {"help", no_argument, NULL, 'h'},
        {"process", required_argument, NULL, 'p'},
        {"diff", required_argument, NULL, 'B'},
        {"base-dump", required_argument, NULL, 'b'},
        {0},
    };
    struct rp_report_options ro = {.top_n = 10, .demangle = true};
    struct rp_trace_options to = {0}, base_to = {0};
    const char *base_path = NULL;
    uint64_t v;
    int c;

    while ((c = getopt_long(argc, argv, "n:h", opts, NULL)) != -1) {
        switch (c) {
        case 'n':
            if (cli_parse_range(optarg, 1, 100000, &v) < 0) {
                fprintf(stderr, "heapprof report: --top wants a number >= 1, not '%s'\n", optarg);
                return EXIT_USAGE;
            }
            ro.top_n = (int)v;
            break;
        case 'd':
            if (cli_parse_range(optarg, 1, INT_MAX, &v) < 0) {
                fprintf(stderr, "heapprof report: --dump wants a number >= 1, not '%s'\n", optarg);
                return EXIT_USAGE;
            }
            to.dump_index = (int)v;
            break;
        case 'b':
            if (cli_parse_range(optarg, 1, INT_MAX, &v) < 0) {
                fprintf(stderr, "heapprof report: --base-dump wants a number >= 1, not '%s'\n",
                        optarg);
                return EXIT_USAGE;
            }
            base_to.dump_index = (int)v;
            break;
        case 'p':
            if (cli_parse_range(optarg, 1, INT32_MAX, &v) < 0) {
                fprintf(stderr, "heapprof report: --process wants a pid, not '%s'\n", optarg);
                return EXIT_USAGE;
            }
            to.pid = base_to.pid = (int32_t)v;
            break;
        case 'B':
            base_path = optarg;
            break;
        case 'D':
            ro.demangle = false;
            break;
        case 'S':
            ro.no_stacks = true;
            break;
        case 'h':
            usage_report(stdout);
            return 0;
        default:
            usage_report(stderr);
            return EXIT_USAGE;
        }
    }
    if (optind != argc - 1) {
        fprintf(stderr, "heapprof report: expected one trace file\n");
        usage_report(stderr);
        return EXIT_USAGE;
    }
    const char *path = argv[optind];
    struct rp_trace *t;
    int r = rp_trace_load(path, &to, &t);
    if (r < 0) {
        fprintf(stderr, "heapprof report: cannot read %s: %s\n", path,
                r == -EBADMSG ? "not a valid trace file" : strerror(-r));
        return 1;
    }
    if (base_path) {
        struct rp_trace *base;
        /* Pids differ between two runs: the base keeps every process when the selection
         * is by pid and the base has no such pid. */
        r = rp_trace_load(base_path, &base_to, &base);
        if (r == 0 && base_to.pid && base->n_processes == 0) {
            base = rp_trace_free(base);
            base_to.pid = 0;
            r = rp_trace_load(base_path, &base_to, &base);
        }
        if (r < 0) {
            fprintf(stderr, "heapprof report: cannot read %s: %s\n", base_path,
                    r == -EBADMSG ? "not a valid trace file" : strerror(-r));
            rp_trace_free(t);
            return 1;
        }
        rp_report_print_diff(stdout, base, t, &ro);
        rp_trace_free(base);
    } else {
        rp_report_print(stdout, t, &ro);
    }
    rp_trace_free(t);
    return 0;
}

int cmd_pprof(int argc, char **argv)
{
    static const struct option opts[] = {
        {"output", required_argument, NULL, 'o'},
        {"dump", required_argument, NULL, 'd'},
        {"process", required_argument, NULL, 'p'},
        {"help", no_argument, NULL, 'h'},
        {0},
    };
    const char *out = NULL;
    int dump = 0;
    int32_t pid = 0;
    uint64_t v;
    int c;

    while ((c = getopt_long(argc, argv, "o:h", opts, NULL)) != -1) {
        switch (c) {
        case 'o':
            out = optarg;
            break;
        case 'd':
            if (cli_parse_range(optarg, 1, INT_MAX, &v) < 0) {
                fprintf(stderr, "heapprof pprof: --dump wants a number >= 1, not '%s'\n", optarg);
                return EXIT_USAGE;
            }
            dump = (int)v;
            break;
        case 'p':
            if (cli_parse_range(optarg, 1, INT32_MAX, &v) < 0) {
                fprintf(stderr, "heapprof pprof: --process wants a pid, not '%s'\n", optarg);
                return EXIT_USAGE;
            }
            pid = (int32_t)v;
            break;
        case 'h':
            usage_pprof(stdout);
            return 0;
        default:
            usage_pprof(stderr);
            return EXIT_USAGE;
        }
    }
    if (optind != argc - 1) {
        fprintf(stderr, "heapprof pprof: expected one trace file\n");
        usage_pprof(stderr);
        return EXIT_USAGE;
    }
    const char *path = argv[optind];
    char prefix[PATH_MAX];
    if (!out) {
        size_t n = strlen(path);
        if (n > 8 && !strcmp(path + n - 8, ".pftrace"))
            n -= 8;
        snprintf(prefix, sizeof(prefix), "%.*s", (int)n, path);
        out = prefix;
    }
    int r = rp_pprof_export(path, out, dump, pid, stdout);
    if (r < 0) {
        fprintf(stderr, "heapprof pprof: %s: %s\n", path,
                r == -ENODATA   ? "no dump matches"
                : r == -EBADMSG ? "not a valid trace file"
                                : strerror(-r));
        return 1;
    }
    return 0;
}
