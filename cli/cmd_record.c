/* cli/cmd_record.c: `heapprof record`: runs a command with libheapprof.so preloaded and
 * profiles it (and, by default, what it executes) from its first allocation. */
#include "cli/cli.h"

#include <dirent.h>
#include <elf.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/macros.h"
#include "common/paths.h"
#include "service/inject.h"

#ifndef HP_LIBDIR_FROM_BINDIR
#define HP_LIBDIR_FROM_BINDIR "../lib"
#endif

extern char **environ;

/* The configuration fields `heapprof record` offers as options. */
static const struct cli_field record_fields[] = {
    {"sampling_interval_bytes", NULL, 0},
    {"shmem_size_bytes", NULL, 0},
    {"max_stack_bytes", NULL, 0},
    {"block_client", NULL, 0},
    {"block_client_timeout_us", NULL, 0},
    {"dump_at_max", NULL, 0},
    {"continuous_dump_config", NULL, 0},
    {"follow_fork", NULL, 0},
    {"no_source_lines", NULL, 0},
    {"no_fast_unwind", NULL, 0},
    {"audit_every", NULL, 0},
    {"heaps", NULL, 0},
    {"all_heaps", NULL, 0},
    {NULL, NULL, 0},
};

enum {
    OPT_SEED = 256,
    OPT_FOLLOW_EXEC,
    OPT_NO_FOLLOW_EXEC,
};

static const struct option record_own_opts[] = {
    {"output", required_argument, NULL, 'o'},
    {"seed", required_argument, NULL, OPT_SEED},
    {"top", required_argument, NULL, CLI_OPT_TOP},
    {"status", no_argument, NULL, CLI_OPT_STATUS},
    {"follow-exec", no_argument, NULL, OPT_FOLLOW_EXEC},
    {"no-follow-exec", no_argument, NULL, OPT_NO_FOLLOW_EXEC},
    {"quiet", no_argument, NULL, 'q'},
    {"help", no_argument, NULL, 'h'},
    {0},
};

static void usage_record(FILE *f, const struct cli_opts *o)
{
    fputs("usage: heapprof record [options] [--] CMD [ARGS...]\n"
          "\n"
          "Runs CMD with libheapprof.so preloaded, profiles it (and, by default, the\n"
          "programs it executes) from its first allocation, writes a Perfetto trace when\n"
          "CMD exits, prints a summary on stderr and exits with CMD's exit status.\n"
          "When CMD exits while processes it started are still profiled (a server that\n"
          "daemonizes, with --follow-fork), recording goes on until they exit, or until\n"
          "Ctrl-C or SIGTERM, which end recording and leave them running. As root, a\n"
          "process that drops to another user (nginx's workers) stays profiled.\n"
          "\n"
          "options:\n"
          "  -o, --output FILE            trace file (default heapprof-<name>-<pid>.pftrace)\n",
          f);
    cli_opts_help(f, o);
    fputs("      --seed N                 fixed sampler seed for reproducible runs\n"
          "      --status                 live status line on a terminal\n"
          "      --follow-exec            the default: every program started by exec()\n"
          "                               (in CMD's process or in a child) is profiled from\n"
          "                               its first allocation, as a process of its own\n"
          "      --no-follow-exec         profile CMD only: programs it executes start\n"
          "                               without libheapprof.so in LD_PRELOAD and without\n"
          "                               HEAPPROF_* variables (the user's LD_PRELOAD\n"
          "                               entries stay); an execve() given an environment\n"
          "                               of the program's own making is not changed\n"
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

char *cli_find_library(void)
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

void cli_set_inject_library(void)
{
    /* Absolute: the process that loads it resolves the path in its own directory. */
    HP_CLEANUP_FREE char *lib = cli_find_library();
    HP_CLEANUP_FREE char *abs = lib ? realpath(lib, NULL) : NULL;
    svc_inject_set_library(abs);
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

/* The user's LD_PRELOAD with every entry naming libheapprof.so (whatever its directory)
 * replaced by @lib, in place; NULL when no entry names it. An allocator preloaded before
 * us stays before us: the client then installs its hooks in the GOT slots of the other
 * objects (preload/got.h). */
static char *preload_in_place(const char *old, const char *lib)
{
    static const char name[] = "libheapprof.so";
    size_t cap = strlen(old) + 1, len = 0;
    bool found = false;
    for (const char *p = old; *p;) {
        size_t n = strcspn(p, ": ");
        size_t base = n;
        while (base > 0 && p[base - 1] != '/')
            base--;
        if (n - base == sizeof(name) - 1 && !memcmp(p + base, name, sizeof(name) - 1)) {
            found = true;
            cap += strlen(lib);
        }
        p += n;
        p += strspn(p, ": ");
    }
    if (!found)
        return NULL;
    char *out = malloc(cap);
    if (!out)
        return NULL;
    for (const char *p = old; *p;) {
        size_t n = strcspn(p, ": ");
        size_t base = n;
        while (base > 0 && p[base - 1] != '/')
            base--;
        bool ours = n - base == sizeof(name) - 1 && !memcmp(p + base, name, sizeof(name) - 1);
        const char *item = ours ? lib : p;
        size_t item_len = ours ? strlen(lib) : n;
        memcpy(out + len, item, item_len);
        len += item_len;
        p += n;
        size_t sep = strspn(p, ": ");
        memcpy(out + len, p, sep);
        len += sep;
        p += sep;
    }
    out[len] = '\0';
    return out;
}

/* Builds the child's environment: ours plus the profiler's variables; LD_PRELOAD keeps
 * the user's entries after ours, or, when the user's LD_PRELOAD names libheapprof.so
 * already, keeps the user's order (with our library at that place). !@follow_exec:
 * HEAPPROF_FOLLOW_EXEC=0, the client takes itself out of the environment at startup
 * (preload/client.c). */
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
    char *in_place = old_preload ? preload_in_place(old_preload, lib) : NULL;
    if (in_place) {
        int r = asprintf(&s, "LD_PRELOAD=%s", in_place);
        free(in_place);
        if (r < 0)
            return NULL;
    } else if (old_preload && *old_preload) {
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

/* What the command line asks for. */
struct record_args {
    struct svc_config cfg;
    struct cli_common_opts common; /* -o, --status, --top, -q */
    const char *seed;              /* NULL: a random seed */
    bool follow_exec;
    char **child_argv; /* CMD [ARGS...] */
};

/* Fills @a from the command line and checks it. Returns < 0 after a usage error (message
 * printed), 0 after --help, > 0 to go on. */
static int record_parse_args(int argc, char **argv, const struct cli_opts *opts,
                             struct record_args *a)
{
    uint64_t v;
    int c;
    while ((c = getopt_long(argc, argv, opts->shortopts, opts->longopts, NULL)) != -1) {
        int r = cli_opts_apply(opts, c, optarg, &a->cfg, "heapprof record");
        if (r == 0)
            r = cli_common_apply(&a->common, c, optarg, "heapprof record");
        if (r < 0)
            return -EINVAL;
        if (r > 0)
            continue;
        switch (c) {
        case OPT_SEED:
            if (cli_parse_range(optarg, 0, LONG_MAX, &v) < 0) {
                fprintf(stderr, "heapprof record: invalid --seed '%s'\n", optarg);
                return -EINVAL;
            }
            a->seed = optarg;
            break;
        case OPT_FOLLOW_EXEC:
            a->follow_exec = true;
            break;
        case OPT_NO_FOLLOW_EXEC:
            a->follow_exec = false;
            break;
        case 'h':
            usage_record(stdout, opts);
            return 0;
        default:
            usage_record(stderr, opts);
            return -EINVAL;
        }
    }
    if (optind >= argc) {
        fprintf(stderr, "heapprof record: no program given\n");
        usage_record(stderr, opts);
        return -EINVAL;
    }
    a->child_argv = argv + optind;
    char err[256];
    if (svc_config_check(&a->cfg, err, sizeof(err)) < 0) {
        fprintf(stderr, "heapprof record: %s\n", err);
        return -EINVAL;
    }
    return 1;
}

/* Finds @name like execvp does and refuses, before anything (a trace) is made, what
 * execve() would refuse or what LD_PRELOAD cannot profile. Returns 0 with the path in
 * @ret_prog (caller frees), or EXIT_NOT_FOUND / EXIT_CANNOT_RUN after a message. */
static int find_runnable(const char *name, char **ret_prog)
{
    HP_CLEANUP_FREE char *prog = find_program(name);
    if (!prog) {
        fprintf(stderr, "heapprof record: cannot find program '%s'%s\n", name,
                strchr(name, '/') ? "" : " in PATH");
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
    struct stat pst;
    const char *why = NULL;
    if (stat(prog, &pst) < 0 || (S_ISREG(pst.st_mode) && access(prog, X_OK) < 0))
        why = strerror(errno);
    else if (!S_ISREG(pst.st_mode))
        why = "not a regular file";
    if (why) {
        fprintf(stderr, "heapprof record: cannot run '%s': %s\n", prog, why);
        return EXIT_CANNOT_RUN;
    }
    if (dyn == -ENOEXEC) {
        fprintf(stderr,
                "heapprof record: cannot run '%s': not an executable format (no 64-bit ELF "
                "header, no #! line)\n",
                prog);
        return EXIT_CANNOT_RUN;
    }
    *ret_prog = prog;
    prog = NULL;
    return 0;
}

/* The child waits for a go byte, so the service is listening (and the output named
 * after its pid is open) before its first allocation. */
struct record_run {
    pid_t child;
    int go_fd;
    const char *name; /* CMD's basename, for messages */
};

/* ---- a program that daemonizes --------------------------------------------------- *
 *
 * A server that daemonizes (nginx, redis --daemonize yes, most init-script daemons)
 * forks, and its foreground process exits at once while the daemon runs on. record is
 * made a child subreaper, so the orphaned daemon becomes our child rather than init's:
 * its descendants are ours to find (and reap). When CMD exits while processes we profile
 * remain (its descendants: with --follow-fork, or programs they executed), recording goes
 * on until they exit or record is stopped (Ctrl-C, SIGTERM), which dumps and ends
 * profiling without touching them: stopping a profiler must not stop a server. Either
 * way, descendants still running when record ends are named. */

#define MAX_DESCENDANTS 16

/* Up to @len - 1 bytes of @path into @buf (NUL-terminated); false when it cannot be
 * read. */
static bool read_proc_file(const char *path, char *buf, size_t len)
{
    FILE *f = fopen(path, "re");
    if (!f)
        return false;
    size_t n = fread(buf, 1, len - 1, f);
    fclose(f);
    buf[n] = '\0';
    return true;
}

/* The parent of @pid, or -1 when it is gone or a zombie. */
static pid_t live_parent(long pid)
{
    char path[64], buf[512], state;
    int ppid;
    snprintf(path, sizeof(path), "/proc/%ld/stat", pid);
    if (!read_proc_file(path, buf, sizeof(buf)))
        return -1;
    const char *p = strrchr(buf, ')');
    if (!p || sscanf(p + 1, " %c %d", &state, &ppid) != 2 || state == 'Z')
        return -1;
    return (pid_t)ppid;
}

static int cmp_pid(const void *a, const void *b)
{
    pid_t x = *(const pid_t *)a, y = *(const pid_t *)b;
    return x < y ? -1 : x > y;
}

/* Every process on the machine, by its parent: the fallback of find_descendants(), and
 * as slow as there are processes (45 ms for 2000 on this machine kind). */
static size_t find_descendants_by_scan(pid_t *out, size_t max)
{
    DIR *d = opendir("/proc");
    if (!d)
        return 0;
    size_t cap = 0, n = 0;
    pid_t(*pp)[2] = NULL; /* pid, parent */
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        char *end;
        long pid = strtol(e->d_name, &end, 10);
        if (*end || pid <= 0)
            continue;
        pid_t ppid = live_parent(pid);
        if (ppid < 0)
            continue;
        if (n == cap) {
            cap = cap ? cap * 2 : 1024;
            void *grown = realloc(pp, cap * sizeof(*pp));
            if (!grown)
                break;
            pp = grown;
        }
        pp[n][0] = (pid_t)pid;
        pp[n][1] = ppid;
        n++;
    }
    closedir(d);
    /* Marked by their parents, to a fixed point: trees are shallow. */
    bool *mine = calloc(n ? n : 1, sizeof(*mine));
    size_t found = 0;
    for (bool more = mine != NULL; more;) {
        more = false;
        for (size_t i = 0; i < n; i++) {
            if (mine[i])
                continue;
            bool parent_mine = pp[i][1] == getpid();
            for (size_t j = 0; j < n && !parent_mine; j++)
                parent_mine = mine[j] && pp[j][0] == pp[i][1];
            if (parent_mine) {
                mine[i] = more = true;
                if (found < max)
                    out[found] = pp[i][0];
                found++;
            }
        }
    }
    free(mine);
    free(pp);
    qsort(out, HP_MIN(found, max), sizeof(*out), cmp_pid);
    return found;
}

#define MAX_WALKED 4096

/* The living descendants of ours (CMD's, and the orphans we inherited as subreaper),
 * at most @max in @out, in pid order; returns how many there are in all. Follows the
 * children of each thread (/proc/PID/task/TID/children) down from us: as fast as there
 * are descendants, where a scan of every process costs as many as the machine runs.
 * Kernels without those files get the scan (as does HEAPPROF_TEST_PROC_SCAN=1, for the
 * tests). At most MAX_WALKED are found. */
static size_t find_descendants(pid_t *out, size_t max)
{
    const char *scan = getenv("HEAPPROF_TEST_PROC_SCAN");
    pid_t *walk = scan && strcmp(scan, "1") == 0 ? NULL : malloc(MAX_WALKED * sizeof(*walk));
    if (!walk)
        return find_descendants_by_scan(out, max);
    size_t n = 0, found = 0;
    walk[n++] = getpid();
    for (size_t i = 0; i < n; i++) {
        char path[96];
        snprintf(path, sizeof(path), "/proc/%d/task", (int)walk[i]);
        DIR *d = opendir(path);
        if (!d) {
            if (i == 0) { /* our own: no /proc to speak of */
                free(walk);
                return find_descendants_by_scan(out, max);
            }
            continue; /* exited meanwhile */
        }
        struct dirent *e;
        while ((e = readdir(d)) != NULL) {
            if (e->d_name[0] == '.')
                continue;
            snprintf(path, sizeof(path), "/proc/%d/task/%.16s/children", (int)walk[i], e->d_name);
            FILE *f = fopen(path, "re");
            if (!f) {
                if (i == 0 && errno == ENOENT) { /* not in this kernel */
                    closedir(d);
                    free(walk);
                    return find_descendants_by_scan(out, max);
                }
                continue;
            }
            long pid;
            while (fscanf(f, "%ld", &pid) == 1) {
                /* A pid seen twice (reused while we walk) is taken once. */
                bool seen = false;
                for (size_t j = 0; j < n && !seen; j++)
                    seen = walk[j] == (pid_t)pid;
                if (pid <= 0 || seen || n == MAX_WALKED || live_parent(pid) < 0)
                    continue;
                walk[n++] = (pid_t)pid;
                if (found < max)
                    out[found] = (pid_t)pid;
                found++;
            }
            fclose(f);
        }
        closedir(d);
    }
    free(walk);
    qsort(out, HP_MIN(found, max), sizeof(*out), cmp_pid);
    return found;
}

/* "1234, 1235, 1236" (and "and N more") for @pids (@n in all, at most @shown given). */
static const char *pid_list(const pid_t *pids, size_t shown, size_t n, char *buf, size_t len)
{
    size_t pos = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < shown && i < n && pos < len; i++)
        pos += (size_t)snprintf(buf + pos, len - pos, "%s%d", i ? ", " : "", (int)pids[i]);
    if (n > shown && pos < len)
        snprintf(buf + pos, len - pos, " and %zu more", n - shown);
    return buf;
}

static void record_child_exited(void *ctx, unsigned live)
{
    struct record_run *rr = ctx;
    pid_t pids[MAX_DESCENDANTS];
    char list[256];
    size_t n = find_descendants(pids, MAX_DESCENDANTS);
    if (n)
        fprintf(stderr, "heapprof record: %s exited; recording its descendants %s until they exit",
                rr->name, pid_list(pids, MAX_DESCENDANTS, n, list, sizeof(list)));
    else if (live == 0)
        return; /* nothing but its own session, still being read */
    else
        fprintf(stderr,
                "heapprof record: %s exited; recording the %u process%s still profiled "
                "until they exit",
                rr->name, live, live == 1 ? "" : "es");
    fputs(" (Ctrl-C or SIGTERM stops recording and leaves them running)\n", stderr);
}

static void record_stopping(void *ctx, const struct cli_loop_result *res)
{
    struct record_run *rr = ctx;
    pid_t pids[MAX_DESCENDANTS];
    char list[256];
    size_t n = find_descendants(pids, MAX_DESCENDANTS);
    if (!n)
        return;
    if (res->child_exited)
        fprintf(stderr, "heapprof record: %s exited; its children %s still run%s\n", rr->name,
                pid_list(pids, MAX_DESCENDANTS, n, list, sizeof(list)),
                res->signo ? " (recording stopped: no longer profiled)"
                           : " (not profiled: they were not followed)");
    else
        fprintf(stderr,
                "heapprof record: recording stopped (signal %d) while %s runs; its "
                "descendants %s still run\n",
                res->signo, rr->name, pid_list(pids, MAX_DESCENDANTS, n, list, sizeof(list)));
}

static int record_started(void *ctx, svc_t *s)
{
    (void)s;
    struct record_run *rr = ctx;
    if (write(rr->go_fd, "g", 1) != 1)
        perror("heapprof record");
    (void)close(rr->go_fd);
    rr->go_fd = -1;
    return 0;
}

/* In the child: waits for the go byte, then runs @prog. */
static _Noreturn void exec_child(const char *prog, char **argv, char **env,
                                 const sigset_t *old_mask, int go[2])
{
    char b;
    (void)close(go[1]);
    /* unwinder/sigmask.c's sigprocmask(), which forwards to libc's: the forked
     * thread is a copy of this one, never inside unwinder_unwind() (cli/loop.c). */
    sigprocmask(SIG_SETMASK, old_mask, NULL);
    if (read(go[0], &b, 1) != 1)
        _exit(EXIT_PROFILER);
    execve(prog, argv, env);
    int e = errno;
    dprintf(STDERR_FILENO, "heapprof record: cannot run '%s': %s\n", prog, strerror(e));
    _exit(e == ENOENT ? EXIT_NOT_FOUND : EXIT_CANNOT_RUN);
}

/* Forks the child that runs @prog, with libheapprof.so @lib preloaded and told the
 * service's socket in @dir, held until rr->go_fd is written. Returns 0, or EXIT_PROFILER
 * after a message. */
static int start_child(const struct record_args *a, const char *prog, const char *lib,
                       const char *dir, struct record_run *rr)
{
    char sock[PATH_MAX + 32];
    snprintf(sock, sizeof(sock), "%s/%s", dir, HP_DAEMON_SOCKET_NAME);
    struct child_env ce = {0};
    char **env = build_env(&ce, lib, sock, a->seed, a->follow_exec);
    if (!env) {
        child_env_done(&ce);
        return EXIT_PROFILER;
    }

    /* Signals are taken through a signalfd; the child gets the original mask back. */
    sigset_t old_mask;
    cli_loop_block_signals(&old_mask);

    int go[2];
    if (pipe2(go, O_CLOEXEC) < 0) {
        perror("heapprof record");
        child_env_done(&ce);
        return EXIT_PROFILER;
    }
    fflush(NULL);
    pid_t child = fork();
    if (child < 0) {
        perror("heapprof record: fork");
        child_env_done(&ce);
        return EXIT_PROFILER;
    }
    if (child == 0)
        exec_child(prog, a->child_argv, env, &old_mask, go);
    (void)close(go[0]);
    child_env_done(&ce);
    *rr = (struct record_run){.child = child, .go_fd = go[1]};
    return 0;
}

/* Runs the program under a session. Returns the program's exit status (EXIT_PROFILER
 * instead of 0 when the profiler failed), or an EXIT_* status after a message. */
static int record_run(struct record_args *a)
{
    HP_CLEANUP_FREE char *prog = NULL;
    int rc = find_runnable(a->child_argv[0], &prog);
    if (rc)
        return rc;
    HP_CLEANUP_FREE char *lib = cli_find_library();
    if (!lib) {
        fprintf(stderr, "heapprof record: cannot find libheapprof.so next to the heapprof "
                        "binary (set HEAPPROF_LIB to its path)\n");
        return EXIT_PROFILER;
    }
    char dir[PATH_MAX];
    int r = hp_private_dir_new(dir, sizeof(dir));
    if (r < 0) {
        fprintf(stderr, "heapprof record: cannot create a private socket directory: %s\n",
                strerror(-r));
        return EXIT_PROFILER;
    }
    a->cfg.socket_dir = dir;
    /* Orphans among CMD's descendants (a daemon) become ours (see above). */
    (void)prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0);
    struct record_run rr;
    rc = start_child(a, prog, lib, dir, &rr);
    rr.name = base_name(prog);
    if (rc) {
        (void)rmdir(dir);
        return rc;
    }

    const char *output = a->common.output;
    HP_CLEANUP_FREE char *out_path = NULL;
    if (output)
        out_path = strdup(output);
    else if (asprintf(&out_path, "heapprof-%s-%d.pftrace", base_name(prog), (int)rr.child) < 0)
        out_path = NULL;
    struct cli_session cs = {
        .prog = "heapprof record",
        .cfg = &a->cfg,
        .output = out_path ? out_path : "?",
        .output_made_up = !output,
        .quiet = a->common.quiet,
        .top = (int)a->common.top,
        .loop =
            {
                .status_line = !a->common.quiet && isatty(STDERR_FILENO) && a->common.status_line,
                .child = rr.child,
                .forward_signals = true,
                .follow_descendants = true,
                .child_exited = record_child_exited,
                .tick_ctx = &rr,
            },
        .started = record_started,
        .stopping = record_stopping,
        .ctx = &rr,
    };
    struct cli_loop_result res;
    r = out_path ? cli_session_run(&cs, &res) : EXIT_PROFILER;
    (void)rmdir(dir);
    if (rr.go_fd >= 0) {
        /* The service never started: the child must not run unprofiled. */
        (void)close(rr.go_fd);
        (void)waitpid(rr.child, NULL, 0);
        return EXIT_PROFILER;
    }
    int status = res.child_status;
    rc = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    if (r != 0)
        return rc ? rc : EXIT_PROFILER;
    return rc;
}

int cmd_record(int argc, char **argv)
{
    struct cli_opts opts;
    struct record_args a = {.common = {.top = 10}, .follow_exec = true};
    svc_config_init(&a.cfg);
    /* A recorded program is ours to slow down: wait for buffer space rather than lose
     * samples (bounded by the timeout). */
    a.cfg.block_client = true;
    /* Root started the program: when it drops to its own user (a server's workers), it
     * is still the program the user asked to profile. */
    a.cfg.follow_any_ids = geteuid() == 0;
    if (cli_opts_build(&opts, record_own_opts, "+o:qh", record_fields) < 0)
        return EXIT_PROFILER;
    int r = record_parse_args(argc, argv, &opts, &a);
    cli_opts_done(&opts);
    int rc = r < 0 ? EXIT_USAGE : r == 0 ? 0 : record_run(&a);
    svc_config_done(&a.cfg);
    return rc;
}
