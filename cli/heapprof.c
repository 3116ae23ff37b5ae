/* cli/heapprof.c: the `heapprof` command.
 *
 *     heapprof record [options] -- CMD [ARGS...]   profile CMD from its first allocation
 *     heapprof report FILE [--top N]               print the top allocation sites
 *     heapprof pprof FILE [-o OUT]                 export the dumps as gzipped pprof
 */
#include <elf.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cli/cli.h"
#include "cli/loop.h"
#include "common/clock.h"
#include "common/log.h"
#include "common/macros.h"
#include "report/report.h"
#include "service/svc.h"

#ifndef HP_LIBDIR_FROM_BINDIR
#define HP_LIBDIR_FROM_BINDIR "../lib"
#endif

extern char **environ;

static void usage_main(FILE *f)
{
    fputs("usage: heapprof COMMAND [ARGS...]\n"
          "\n"
          "A sampling heap profiler. Commands:\n"
          "  record [options] -- CMD [ARGS...]  run CMD under the profiler, write a trace\n"
          "  report FILE [options]              print the top allocation sites of a trace\n"
          "  attach -p PID | -n NAME [options]  profile running processes that have\n"
          "                                     libheapprof.so preloaded\n"
          "  dump [DAEMON_PID]                  ask the running heapprofd to dump now\n"
          "  pprof FILE [options]               export the dumps of a trace as pprof files\n"
          "\n"
          "Run 'heapprof COMMAND --help' for the options of a command.\n",
          f);
}

static void usage_record(FILE *f)
{
    fputs("usage: heapprof record [options] [--] CMD [ARGS...]\n"
          "\n"
          "Runs CMD with libheapprof.so preloaded, profiles it (and, by default, the\n"
          "programs it executes) from its first allocation, writes a Perfetto trace when\n"
          "CMD exits, prints a summary on stderr and exits with CMD's exit status.\n"
          "\n"
          "options:\n"
          "  -o, --output FILE            trace file (default heapprof-<name>-<pid>.pftrace)\n"
          "  -i, --sampling-interval N    mean bytes between samples (default 4096; 1 records\n"
          "                               every allocation); suffixes k, M, G accepted\n"
          "      --shmem-size N           shared buffer per process, power of two (default 8M)\n"
          "      --max-stack N            bytes of stack copied per sample (default 64k)\n"
          "      --no-block-client        drop samples when the buffer is full instead of\n"
          "                               making the app wait (the default waits, bounded\n"
          "                               by --block-timeout-us)\n"
          "      --block-timeout-us N     longest wait for buffer space (default 100000)\n"
          "      --dump-at-max            report live memory at the peak, not at the end\n"
          "      --seed N                 fixed sampler seed for reproducible runs\n"
          "      --continuous-dump MS[,PHASE_MS]  also dump every MS milliseconds\n"
          "      --status                 live status line on a terminal\n"
          "      --follow-fork            also profile children of fork() until they exec,\n"
          "                               each as its own process\n"
          "      --no-follow-fork         the default: such children are not profiled\n"
          "      --follow-exec            the default: every program started by exec()\n"
          "                               (in CMD's process or in a child) is profiled from\n"
          "                               its first allocation, as a process of its own\n"
          "      --no-follow-exec         profile CMD only: programs it executes start\n"
          "                               without libheapprof.so in LD_PRELOAD and without\n"
          "                               HEAPPROF_* variables (the user's LD_PRELOAD\n"
          "                               entries stay); an execve() given an environment\n"
          "                               of the program's own making is not changed\n"
          "      --no-fast-unwind         copy every sampled stack for the service to\n"
          "                               unwind (by default the app walks its own stack\n"
          "                               once the service has published the rules)\n"
          "      --audit-every N          check every Nth stack a thread walked itself\n"
          "                               against an unwind of its copy (default 1024;\n"
          "                               0: never)\n"
          "      --top N                  sites in the summary (default 10; 0: none)\n"
          "  -q, --quiet                  no summary\n"
          "  -h, --help                   this help\n"
          "\n"
          "examples:\n"
          "  heapprof record -- ./myapp arg1 arg2\n"
          "  heapprof record -o app.pftrace -i 1 -- python3 script.py\n"
          "  heapprof report app.pftrace\n"
          "\n"
          "exit status: CMD's status (128+N if killed by signal N); 2 usage error;\n"
          "3 profiler failure; 126 CMD cannot run; 127 CMD not found.\n",
          f);
}

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

static int parse_int(const char *s, long min, long max, long *ret)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < min || v > max)
        return -EINVAL;
    *ret = v;
    return 0;
}

/* ---- report ----------------------------------------------------------------------- */

static int cmd_report(int argc, char **argv)
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
    long v;
    int c;

    while ((c = getopt_long(argc, argv, "n:h", opts, NULL)) != -1) {
        switch (c) {
        case 'n':
            if (parse_int(optarg, 1, 100000, &v) < 0) {
                fprintf(stderr, "heapprof report: --top wants a number >= 1, not '%s'\n", optarg);
                return EXIT_USAGE;
            }
            ro.top_n = (int)v;
            break;
        case 'd':
            if (parse_int(optarg, 1, INT_MAX, &v) < 0) {
                fprintf(stderr, "heapprof report: --dump wants a number >= 1, not '%s'\n", optarg);
                return EXIT_USAGE;
            }
            to.dump_index = (int)v;
            break;
        case 'b':
            if (parse_int(optarg, 1, INT_MAX, &v) < 0) {
                fprintf(stderr, "heapprof report: --base-dump wants a number >= 1, not '%s'\n",
                        optarg);
                return EXIT_USAGE;
            }
            base_to.dump_index = (int)v;
            break;
        case 'p':
            if (parse_int(optarg, 1, INT32_MAX, &v) < 0) {
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

/* ---- pprof ------------------------------------------------------------------------ */

static int cmd_pprof(int argc, char **argv)
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
    long v;
    int c;

    while ((c = getopt_long(argc, argv, "o:h", opts, NULL)) != -1) {
        switch (c) {
        case 'o':
            out = optarg;
            break;
        case 'd':
            if (parse_int(optarg, 1, INT_MAX, &v) < 0) {
                fprintf(stderr, "heapprof pprof: --dump wants a number >= 1, not '%s'\n", optarg);
                return EXIT_USAGE;
            }
            dump = (int)v;
            break;
        case 'p':
            if (parse_int(optarg, 1, INT32_MAX, &v) < 0) {
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

/* ---- record ----------------------------------------------------------------------- */

/* Finds @name like execvp does. Returns a malloc'd path, or NULL with errno set. */
static char *find_program(const char *name)
{
    if (strchr(name, '/')) {
        if (access(name, F_OK) < 0)
            return NULL;
        return strdup(name);
    }
    const char *path = getenv("PATH");
    if (!path || !*path)
        path = "/usr/local/bin:/usr/bin:/bin";
    const char *p = path;
    int saved = ENOENT;
    while (*p) {
        const char *colon = strchr(p, ':');
        size_t len = colon ? (size_t)(colon - p) : strlen(p);
        char *cand;
        if (asprintf(&cand, "%.*s%s%s", (int)len, p, len ? "/" : "", name) < 0)
            return NULL;
        struct stat st;
        if (stat(cand, &st) == 0 && S_ISREG(st.st_mode)) {
            if (access(cand, X_OK) == 0)
                return cand;
            saved = EACCES;
        }
        free(cand);
        p = colon ? colon + 1 : p + len;
    }
    errno = saved;
    return NULL;
}

/* Returns 1 for a dynamically linked ELF (or a script), 0 for a static ELF, -errno. */
static int is_dynamic(const char *path)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    Elf64_Ehdr eh;
    ssize_t n = pread(fd, &eh, sizeof(eh), 0);
    int res = 1;
    if (n >= 2 && memcmp(&eh, "#!", 2) == 0)
        goto out; /* a script: its interpreter decides */
    if (n != (ssize_t)sizeof(eh) || memcmp(eh.e_ident, ELFMAG, SELFMAG) != 0 ||
        eh.e_ident[EI_CLASS] != ELFCLASS64) {
        res = -ENOEXEC;
        goto out;
    }
    res = 0;
    for (unsigned i = 0; i < eh.e_phnum && i < 512; i++) {
        Elf64_Phdr ph;
        if (pread(fd, &ph, sizeof(ph), (off_t)(eh.e_phoff + (uint64_t)i * eh.e_phentsize)) !=
            (ssize_t)sizeof(ph))
            break;
        if (ph.p_type == PT_INTERP || ph.p_type == PT_DYNAMIC) {
            res = 1;
            break;
        }
    }
out:
    (void)close(fd);
    return res;
}

/* libheapprof.so next to this binary: in the build tree (../preload/) or installed. */
static char *find_library(void)
{
    const char *env = getenv("HEAPPROF_LIB");
    if (env && *env)
        return access(env, R_OK) == 0 ? strdup(env) : NULL;
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
    if (n < 0)
        return NULL;
    exe[n] = '\0';
    char *slash = strrchr(exe, '/');
    if (!slash)
        return NULL;
    *slash = '\0';
    const char *rel[] = {"../preload", HP_LIBDIR_FROM_BINDIR, "../lib", "../lib64", "."};
    for (size_t i = 0; i < sizeof(rel) / sizeof(rel[0]); i++) {
        char *cand, *real;
        if (asprintf(&cand, "%s/%s/libheapprof.so", exe, rel[i]) < 0)
            return NULL;
        real = realpath(cand, NULL);
        free(cand);
        if (real && access(real, R_OK) == 0)
            return real;
        free(real);
    }
    return NULL;
}

static const char *base_name(const char *p)
{
    const char *s = strrchr(p, '/');
    return s ? s + 1 : p;
}

struct child_env {
    char **env;
    char *owned[4];
    size_t n_owned;
};

static void child_env_done(struct child_env *ce)
{
    for (size_t i = 0; i < ce->n_owned; i++)
        free(ce->owned[i]);
    free(ce->env);
    memset(ce, 0, sizeof(*ce));
}

/* Builds the child's environment: ours plus the profiler's variables; LD_PRELOAD keeps
 * the user's entries after ours. !@follow_exec: HEAPPROF_FOLLOW_EXEC=0, the client takes
 * itself out of the environment at startup (preload/client.c). */
static char **build_env(struct child_env *ce, const char *lib, const char *sock, const char *seed,
                        bool follow_exec)
{
    size_t n = 0;
    while (environ[n])
        n++;
    char **env = calloc(n + 8, sizeof(*env));
    if (!env)
        return NULL;
    ce->env = env;
    size_t k = 0;
    const char *old_preload = NULL;
    for (size_t i = 0; i < n; i++) {
        if (!strncmp(environ[i], "LD_PRELOAD=", 11)) {
            old_preload = environ[i] + 11;
            continue;
        }
        if (!strncmp(environ[i], "HEAPPROF_", 9))
            continue;
        env[k++] = environ[i];
    }
    char *s;
    if (old_preload && *old_preload) {
        if (asprintf(&s, "LD_PRELOAD=%s:%s", lib, old_preload) < 0)
            return NULL;
    } else if (asprintf(&s, "LD_PRELOAD=%s", lib) < 0) {
        return NULL;
    }
    env[k++] = ce->owned[ce->n_owned++] = s;
    if (asprintf(&s, "HEAPPROF_SOCKET=%s", sock) < 0)
        return NULL;
    env[k++] = ce->owned[ce->n_owned++] = s;
    env[k++] = "HEAPPROF_STARTUP=1";
    if (!follow_exec)
        env[k++] = "HEAPPROF_FOLLOW_EXEC=0";
    if (seed) {
        if (asprintf(&s, "HEAPPROF_SEED=%s", seed) < 0)
            return NULL;
        env[k++] = ce->owned[ce->n_owned++] = s;
    }
    env[k] = NULL;
    return env;
}

static int make_socket_dir(char *buf, size_t len)
{
    const char *base = getenv("XDG_RUNTIME_DIR");
    struct stat st;
    if (!base || base[0] != '/' || stat(base, &st) < 0 || !S_ISDIR(st.st_mode) ||
        access(base, W_OK | X_OK) < 0)
        base = "/tmp";
    int n = snprintf(buf, len, "%s/heapprof-XXXXXX", base);
    if (n < 0 || (size_t)n >= len)
        return -ENAMETOOLONG;
    if (!mkdtemp(buf))
        return -errno;
    return 0;
}

static int cmd_record(int argc, char **argv)
{
    static const struct option opts[] = {
        {"output", required_argument, NULL, 'o'},
        {"sampling-interval", required_argument, NULL, 'i'},
        {"shmem-size", required_argument, NULL, 'S'},
        {"max-stack", required_argument, NULL, 'K'},
        {"block-client", no_argument, NULL, 'B'},
        {"no-block-client", no_argument, NULL, 'N'},
        {"block-timeout-us", required_argument, NULL, 'T'},
        {"dump-at-max", no_argument, NULL, 'M'},
        {"seed", required_argument, NULL, 's'},
        {"top", required_argument, NULL, 'n'},
        {"continuous-dump", required_argument, NULL, 'C'},
        {"status", no_argument, NULL, 'U'},
        {"follow-fork", no_argument, NULL, 'F'},
        {"no-follow-fork", no_argument, NULL, 'f'},
        {"follow-exec", no_argument, NULL, 'E'},
        {"no-follow-exec", no_argument, NULL, 'e'},
        {"no-fast-unwind", no_argument, NULL, 'W'},
        {"audit-every", required_argument, NULL, 'A'},
        {"quiet", no_argument, NULL, 'q'},
        {"help", no_argument, NULL, 'h'},
        {0},
    };
    struct svc_config cfg;
    const char *output = NULL, *seed = NULL;
    bool quiet = false, status_line = false, follow_exec = true;
    long top = 10, v;
    uint64_t bytes;
    int c;

    svc_config_init(&cfg);
    /* A recorded program is ours to slow down: wait for buffer space rather than lose
     * samples (bounded by the timeout). */
    cfg.block_client = true;
    while ((c = getopt_long(argc, argv, "+o:i:qh", opts, NULL)) != -1) {
        switch (c) {
        case 'o':
            output = optarg;
            break;
        case 'i':
            if (svc_parse_bytes(optarg, &bytes) < 0) {
                fprintf(stderr,
                        "heapprof record: invalid sampling interval '%s': expected a number "
                        "of bytes >= 1 (e.g. 4096, 512k)\n",
                        optarg);
                return EXIT_USAGE;
            }
            cfg.sampling_interval_bytes = bytes;
            break;
        case 'S':
            if (svc_parse_bytes(optarg, &bytes) < 0) {
                fprintf(stderr, "heapprof record: invalid --shmem-size '%s'\n", optarg);
                return EXIT_USAGE;
            }
            cfg.shmem_size_bytes = bytes;
            break;
        case 'K':
            if (svc_parse_bytes(optarg, &bytes) < 0) {
                fprintf(stderr, "heapprof record: invalid --max-stack '%s'\n", optarg);
                return EXIT_USAGE;
            }
            cfg.max_stack_bytes = bytes;
            break;
        case 'B':
            cfg.block_client = true;
            break;
        case 'N':
            cfg.block_client = false;
            break;
        case 'T':
            if (parse_int(optarg, 0, 60000000, &v) < 0) {
                fprintf(stderr, "heapprof record: invalid --block-timeout-us '%s'\n", optarg);
                return EXIT_USAGE;
            }
            cfg.block_client_timeout_us = (uint32_t)v;
            break;
        case 'M':
            cfg.dump_at_max = true;
            break;
        case 's':
            if (parse_int(optarg, 0, LONG_MAX, &v) < 0) {
                fprintf(stderr, "heapprof record: invalid --seed '%s'\n", optarg);
                return EXIT_USAGE;
            }
            seed = optarg;
            break;
        case 'n':
            if (parse_int(optarg, 0, 100000, &top) < 0) {
                fprintf(stderr, "heapprof record: invalid --top '%s'\n", optarg);
                return EXIT_USAGE;
            }
            break;
        case 'C':
            if (parse_continuous_dump(optarg, &cfg) < 0) {
                fprintf(stderr,
                        "heapprof record: invalid --continuous-dump '%s': expected "
                        "INTERVAL_MS[,PHASE_MS] with INTERVAL_MS >= 10\n",
                        optarg);
                return EXIT_USAGE;
            }
            break;
        case 'U':
            status_line = true;
            break;
        case 'F':
            cfg.follow_fork = true;
            break;
        case 'f':
            cfg.follow_fork = false;
            break;
        case 'E':
            follow_exec = true;
            break;
        case 'e':
            follow_exec = false;
            break;
        case 'W':
            cfg.no_fast_unwind = true;
            break;
        case 'A':
            if (parse_int(optarg, 0, UINT32_MAX, &v) < 0) {
                fprintf(stderr, "heapprof record: invalid --audit-every '%s'\n", optarg);
                return EXIT_USAGE;
            }
            cfg.audit_every = (uint32_t)v;
            break;
        case 'q':
            quiet = true;
            break;
        case 'h':
            usage_record(stdout);
            return 0;
        default:
            usage_record(stderr);
            return EXIT_USAGE;
        }
    }
    if (optind >= argc) {
        fprintf(stderr, "heapprof record: no program given\n");
        usage_record(stderr);
        return EXIT_USAGE;
    }
    char err[256];
    if (svc_config_check(&cfg, err, sizeof(err)) < 0) {
        fprintf(stderr, "heapprof record: %s\n", err);
        return EXIT_USAGE;
    }
    char **child_argv = argv + optind;
    HP_CLEANUP_FREE char *prog = find_program(child_argv[0]);
    if (!prog) {
        fprintf(stderr, "heapprof record: cannot find program '%s'%s\n", child_argv[0],
                strchr(child_argv[0], '/') ? "" : " in PATH");
        return EXIT_NOT_FOUND;
    }
    int dyn = is_dynamic(prog);
    if (dyn == 0) {
        fprintf(stderr,
                "heapprof record: '%s' is statically linked; heapprof works through "
                "LD_PRELOAD and needs a dynamically linked program\n",
                prog);
        return EXIT_CANNOT_RUN;
    }
    if (dyn < 0 && dyn != -ENOEXEC) {
        fprintf(stderr, "heapprof record: cannot read '%s': %s\n", prog, strerror(-dyn));
        return EXIT_CANNOT_RUN;
    }
    HP_CLEANUP_FREE char *lib = find_library();
    if (!lib) {
        fprintf(stderr, "heapprof record: cannot find libheapprof.so next to the heapprof "
                        "binary (set HEAPPROF_LIB to its path)\n");
        return EXIT_PROFILER;
    }

    char dir[PATH_MAX], sock[PATH_MAX + 32];
    int r = make_socket_dir(dir, sizeof(dir));
    if (r < 0) {
        fprintf(stderr, "heapprof record: cannot create a private socket directory: %s\n",
                strerror(-r));
        return EXIT_PROFILER;
    }
    snprintf(sock, sizeof(sock), "%s/heapprofd.sock", dir);
    cfg.socket_dir = dir;
    struct child_env ce = {0};
    char **env = build_env(&ce, lib, sock, seed, follow_exec);
    if (!env) {
        child_env_done(&ce);
        (void)rmdir(dir);
        return EXIT_PROFILER;
    }

    /* Signals are taken through a signalfd; the child gets the original mask back. */
    sigset_t old_mask;
    svc_loop_block_signals(&old_mask);

    /* The child waits for a go byte, so the service is listening (and the output named
     * after its pid is open) before its first allocation. */
    int go[2];
    if (pipe2(go, O_CLOEXEC) < 0) {
        perror("heapprof record");
        (void)rmdir(dir);
        return EXIT_PROFILER;
    }
    fflush(NULL);
    pid_t child = fork();
    if (child < 0) {
        perror("heapprof record: fork");
        (void)rmdir(dir);
        return EXIT_PROFILER;
    }
    if (child == 0) {
        char b;
        (void)close(go[1]);
        sigprocmask(SIG_SETMASK, &old_mask, NULL);
        if (read(go[0], &b, 1) != 1)
            _exit(EXIT_PROFILER);
        execve(prog, child_argv, env);
        int e = errno;
        dprintf(STDERR_FILENO, "heapprof record: cannot run '%s': %s\n", prog, strerror(e));
        _exit(e == ENOENT ? EXIT_NOT_FOUND : EXIT_CANNOT_RUN);
    }
    (void)close(go[0]);
    child_env_done(&ce);

    HP_CLEANUP_FREE char *out_path = NULL;
    if (output)
        out_path = strdup(output);
    else if (asprintf(&out_path, "heapprof-%s-%d.pftrace", base_name(prog), (int)child) < 0)
        out_path = NULL;
    int out_fd = out_path ? open(out_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644) : -1;
    svc_t *s = NULL;
    if (out_fd < 0) {
        fprintf(stderr, "heapprof record: cannot write the trace to '%s': %s\n",
                out_path ? out_path : "?", strerror(errno));
    } else {
        r = svc_new(&cfg, out_fd, &s);
        if (r < 0)
            fprintf(stderr, "heapprof record: cannot start the profiling service: %s\n",
                    strerror(-r));
    }
    if (!s) {
        (void)close(go[1]);
        (void)waitpid(child, NULL, 0);
        (void)rmdir(dir);
        return EXIT_PROFILER;
    }
    if (write(go[1], "g", 1) != 1) {
        perror("heapprof record");
    }
    (void)close(go[1]);

    struct svc_loop_opts lo = {
        .dump_interval_ms = cfg.dump_interval_ms,
        .dump_phase_ms = cfg.dump_phase_ms,
        .status_line = !quiet && isatty(STDERR_FILENO) && status_line,
        .child = child,
        .forward_signals = true,
    };
    struct svc_loop_result res;
    r = svc_loop_run(s, &lo, &res);
    if (r < 0)
        hp_log_warn("%s", strerror(-r));
    int status = res.child_status;
    svc_loop_arm_second_interrupt(out_fd, s);

    struct svc_summary sum;
    r = svc_finish(s, &sum);
    svc_free(s);
    (void)rmdir(dir);
    if (close(out_fd) < 0 && r == 0)
        r = -errno;
    int rc = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);

    if (r < 0) {
        fprintf(stderr, "heapprof record: writing '%s' failed: %s\n", out_path, strerror(-r));
        return rc ? rc : EXIT_PROFILER;
    }
    if (!quiet)
        svc_print_summary(out_path, &sum, (int)top);
    return rc;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        usage_main(stderr);
        return EXIT_USAGE;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "-h") || !strcmp(cmd, "--help") || !strcmp(cmd, "help")) {
        usage_main(stdout);
        return 0;
    }
    if (!strcmp(cmd, "--version")) {
        printf("heapprof %s\n", HP_VERSION);
        return 0;
    }
    if (!strcmp(cmd, "record"))
        return cmd_record(argc - 1, argv + 1);
    if (!strcmp(cmd, "report"))
        return cmd_report(argc - 1, argv + 1);
    if (!strcmp(cmd, "attach"))
        return cmd_attach(argc - 1, argv + 1);
    if (!strcmp(cmd, "dump"))
        return cmd_dump(argc - 1, argv + 1);
    if (!strcmp(cmd, "pprof"))
        return cmd_pprof(argc - 1, argv + 1);
    fprintf(stderr, "heapprof: unknown command '%s'\n", cmd);
    usage_main(stderr);
    return EXIT_USAGE;
}
