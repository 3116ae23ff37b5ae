#include "tests/e2e/e2e_util.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pty.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

static int append(char **buf, size_t *len, size_t *cap, const char *data, size_t n)
{
    if (*len + n + 1 > *cap) {
        size_t c = (*cap ? *cap * 2 : 4096);
        while (c < *len + n + 1)
            c *= 2;
        char *b = realloc(*buf, c);
        if (!b)
            return -ENOMEM;
        *buf = b;
        *cap = c;
    }
    memcpy(*buf + *len, data, n);
    *len += n;
    (*buf)[*len] = '\0';
    return 0;
}

int e2e_run(char *const argv[], char *const env[], struct e2e_run *ret)
{
    int po[2], pe[2];
    if (pipe2(po, O_CLOEXEC) < 0 || pipe2(pe, O_CLOEXEC) < 0)
        return -errno;
    size_t n_env = 0, n_extra = 0;
    while (environ[n_env])
        n_env++;
    while (env && env[n_extra])
        n_extra++;
    char **full = calloc(n_env + n_extra + 1, sizeof(char *));
    size_t k = 0;
    for (size_t i = 0; i < n_extra; i++)
        full[k++] = env[i];
    for (size_t i = 0; i < n_env; i++) {
        const char *eq = strchr(environ[i], '=');
        size_t nl = eq ? (size_t)(eq - environ[i]) + 1 : strlen(environ[i]);
        bool overridden = false;
        for (size_t j = 0; j < n_extra; j++)
            overridden |= strncmp(env[j], environ[i], nl) == 0;
        if (!overridden)
            full[k++] = environ[i];
    }
    full[k] = NULL;
    pid_t pid = fork();
    if (pid < 0)
        return -errno;
    if (pid == 0) {
        dup2(po[1], 1);
        dup2(pe[1], 2);
        execvpe(argv[0], argv, full);
        _exit(127);
    }
    free(full);
    close(po[1]);
    close(pe[1]);
    memset(ret, 0, sizeof(*ret));
    size_t ol = 0, oc = 0, el = 0, ec = 0;
    append(&ret->out, &ol, &oc, "", 0);
    append(&ret->err, &el, &ec, "", 0);
    struct pollfd pf[2] = {{.fd = po[0], .events = POLLIN}, {.fd = pe[0], .events = POLLIN}};
    int open_fds = 2;
    while (open_fds > 0) {
        if (poll(pf, 2, -1) < 0 && errno != EINTR)
            break;
        for (int i = 0; i < 2; i++) {
            if (pf[i].fd < 0 || !(pf[i].revents & (POLLIN | POLLHUP | POLLERR)))
                continue;
            char buf[65536];
            ssize_t n = read(pf[i].fd, buf, sizeof(buf));
            if (n <= 0) {
                close(pf[i].fd);
                pf[i].fd = -1;
                open_fds--;
                continue;
            }
            if (i == 0)
                append(&ret->out, &ol, &oc, buf, (size_t)n);
            else
                append(&ret->err, &el, &ec, buf, (size_t)n);
        }
    }
    int st;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
        ;
    ret->status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    return 0;
}

int e2e_run_pty(char *const argv[], struct e2e_run *ret)
{
    int master;
    pid_t pid = forkpty(&master, NULL, NULL, NULL);
    if (pid < 0)
        return -errno;
    if (pid == 0) {
        execvp(argv[0], argv);
        _exit(127);
    }
    memset(ret, 0, sizeof(*ret));
    size_t ol = 0, oc = 0, el = 0, ec = 0;
    append(&ret->out, &ol, &oc, "", 0);
    append(&ret->err, &el, &ec, "", 0);
    for (;;) {
        char buf[65536];
        ssize_t n = read(master, buf, sizeof(buf));
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) /* EIO once the last holder of the terminal is gone */
            break;
        append(&ret->out, &ol, &oc, buf, (size_t)n);
    }
    close(master);
    int st;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
        ;
    ret->status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    return 0;
}

void e2e_run_free(struct e2e_run *r)
{
    free(r->out);
    free(r->err);
    r->out = r->err = NULL;
}

size_t e2e_parse_truth(const char *out, struct e2e_truth *t, size_t max)
{
    size_t n = 0;
    const char *p = out;
    while (p && *p && n < max) {
        unsigned long long a, b, c, d;
        char name[64];
        if (sscanf(p, "truth %63s %llu %llu %llu %llu", name, &a, &b, &c, &d) == 5) {
            snprintf(t[n].name, sizeof(t[n].name), "%s", name);
            t[n].alloc_bytes = a;
            t[n].alloc_count = b;
            t[n].free_bytes = c;
            t[n].free_count = d;
            n++;
        }
        p = strchr(p, '\n');
        if (p)
            p++;
    }
    return n;
}

void e2e_sum_function(const struct rp_trace_process *p, const char *fn, struct e2e_sums *ret)
{
    memset(ret, 0, sizeof(*ret));
    for (size_t i = 0; i < p->n_callsites; i++) {
        const struct rp_trace_callsite *cs = &p->callsites[i];
        bool hit = false;
        for (size_t j = 0; j < cs->n_frames && !hit; j++) {
            char buf[1024];
            const char *name = rp_demangle(cs->frames[j].function_name, buf, sizeof(buf));
            hit = strstr(name, fn) != NULL;
        }
        if (!hit)
            continue;
        ret->alloc_bytes += cs->self_allocated;
        ret->alloc_count += cs->alloc_count;
        ret->free_bytes += cs->self_freed;
        ret->free_count += cs->free_count;
        ret->callsites++;
    }
}

const struct rp_trace_process *e2e_find_process(const struct rp_trace *t, const char *needle)
{
    for (size_t i = 0; i < t->n_processes; i++)
        if (t->processes[i].cmdline && strstr(t->processes[i].cmdline, needle))
            return &t->processes[i];
    return NULL;
}

char *e2e_tmp_path(const char *suffix)
{
    const char *dir = getenv("TMPDIR");
    if (!dir || !*dir)
        dir = "/tmp";
    char tmpl[4096];
    snprintf(tmpl, sizeof(tmpl), "%s/heapprof-e2e-XXXXXX", dir);
    int fd = mkstemp(tmpl);
    if (fd < 0)
        return NULL;
    close(fd);
    unlink(tmpl);
    char *p;
    if (asprintf(&p, "%s%s", tmpl, suffix) < 0)
        return NULL;
    return p;
}

const char *e2e_env(const char *var)
{
    const char *v = getenv(var);
    if (!v || !*v) {
        fprintf(stderr, "environment variable %s is not set\n", var);
        abort();
    }
    return v;
}

int e2e_check_protoc(const char *trace)
{
    const char *protoc = getenv("PROTOC");
    if (!protoc || !*protoc)
        return 0; /* not installed: the unit suite's protoc test reports it */
    char cmd[8192];
    snprintf(cmd, sizeof(cmd),
             "'%s' --decode=perfetto.protos.Trace -I '%s' '%s' < '%s' > /dev/null", protoc,
             e2e_env("PROTOS_DIR"), e2e_env("TRACE_PROTO"), trace);
    return system(cmd);
}

char *e2e_trace_processor_query(const char *trace, const char *sql)
{
    const char *tp = getenv("TRACE_PROCESSOR");
    if (!tp || !*tp || access(tp, X_OK) != 0)
        return NULL;
    char *argv[] = {(char *)tp, "-Q", (char *)sql, (char *)trace, NULL};
    struct e2e_run run;
    if (e2e_run(argv, NULL, &run) < 0)
        return strdup("(trace_processor_shell did not run)");
    if (run.status != 0) {
        fprintf(stderr, "trace_processor_shell: status %d: %s\n", run.status,
                run.err ? run.err : "");
        e2e_run_free(&run);
        return strdup("(trace_processor_shell failed)");
    }
    char *out = run.out ? run.out : strdup("");
    run.out = NULL;
    e2e_run_free(&run);
    return out;
}

/* Perfetto's own trace processor, where present (TRACE_PROCESSOR, set by the build when
 * the project's sibling directory shared/perfetto has it): 0 when it reads @trace with
 * no error stat, 1 after printing the ones it has, 0 with a note when it is absent.
 * E2E_KEEP_BAD_TRACES=1 keeps a copy of a rejected trace in /tmp. */
static int check_trace_processor(const char *trace)
{
    const char *tp = getenv("TRACE_PROCESSOR");
    static bool said;
    if (!tp || !*tp || access(tp, X_OK) != 0) {
        if (!said)
            fprintf(stderr, "(Perfetto's trace_processor_shell is absent: not used)\n");
        said = true;
        return 0;
    }
    char *argv[] = {(char *)tp, "-Q",
                    /* Not the flags of a profile (its dump says them too, and tests
                     * provoke them): a guardrail hit, a corrupted buffer, a client
                     * error, a concurrent session refused. */
                    "select name, idx, severity, value from stats where value > 0 and "
                    "severity = 'error' and name not in ('heapprofd_hit_guardrail', "
                    "'heapprofd_buffer_corrupted', 'heapprofd_client_error', "
                    "'heapprofd_rejected_concurrent')",
                    (char *)trace, NULL};
    struct e2e_run run;
    if (e2e_run(argv, NULL, &run) < 0)
        return -1;
    int st = run.status;
    /* The answer is a header line and one line per stat. */
    const char *nl = run.out ? strchr(run.out, '\n') : NULL;
    if (st == 0 && nl && nl[1] != '\0')
        st = 1;
    if (st != 0 && getenv("E2E_KEEP_BAD_TRACES")) {
        char cmd[600];
        snprintf(cmd, sizeof(cmd), "cp '%s' /tmp/", trace);
        (void)!system(cmd);
    }
    if (st != 0)
        fprintf(stderr, "trace_processor_shell on %s: status %d\n%s%s", trace, run.status,
                run.out ? run.out : "", run.err ? run.err : "");
    e2e_run_free(&run);
    return st;
}

int e2e_check_rules(const char *trace)
{
    char *argv[] = {(char *)e2e_env("CHECK_TRACE"), (char *)trace, NULL};
    struct e2e_run run;
    if (e2e_run(argv, NULL, &run) < 0)
        return -1;
    if (run.status != 0)
        fprintf(stderr, "%s", run.err);
    int st = run.status;
    e2e_run_free(&run);
    return st != 0 ? st : check_trace_processor(trace);
}

long long e2e_number_before(const char *text, const char *what)
{
    const char *at = strstr(text, what);
    if (!at)
        return -1;
    const char *num = at;
    while (num > text && num[-1] >= '0' && num[-1] <= '9')
        num--;
    return num == at ? -1 : strtoll(num, NULL, 10);
}

void e2e_sleep_ms(long ms)
{
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000};
    while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
        ;
}

int e2e_wait_status(pid_t pid)
{
    int st;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
        ;
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

bool e2e_alive(pid_t pid)
{
    int st;
    return waitpid(pid, &st, WNOHANG) == 0;
}

char *e2e_read_file(const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return strdup("");
    char *buf = calloc(1, 1 << 20);
    size_t n = fread(buf, 1, (1 << 20) - 1, f);
    buf[n] = '\0';
    fclose(f);
    return buf;
}

int e2e_runtime_dir_make(char *buf, size_t size, const char *tag)
{
    int n = snprintf(buf, size, "/tmp/heapprof-e2e-%s-XXXXXX", tag);
    if (n < 0 || (size_t)n >= size || !mkdtemp(buf))
        return -1;
    return setenv("XDG_RUNTIME_DIR", buf, 1);
}

int e2e_runtime_dir_remove(const char *dir)
{
    char cmd[512];
    int n = snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    if (n < 0 || (size_t)n >= sizeof(cmd))
        return -1;
    return system(cmd) == 0 ? 0 : -1;
}

int e2e_target_start(struct e2e_target *t, const char *dir, char *const argv[], const char *preload,
                     const char *ready_text)
{
    static int seq;
    snprintf(t->out, sizeof(t->out), "%s/out-%d.txt", dir, seq++);
    int in[2];
    if (pipe2(in, O_CLOEXEC) < 0)
        return -1;
    t->pid = fork();
    if (t->pid < 0) {
        close(in[0]);
        close(in[1]);
        return -1;
    }
    if (t->pid == 0) {
        int fd = open(t->out, O_WRONLY | O_CREAT | O_TRUNC | O_APPEND, 0644);
        dup2(fd, 1);
        dup2(fd, 2);
        dup2(in[0], 0);
        if (preload) {
            setenv("LD_PRELOAD", preload, 1);
            setenv("HEAPPROF_STARTUP", "0", 1);
        }
        execv(argv[0], argv);
        _exit(127);
    }
    close(in[0]);
    t->in = in[1];
    for (int i = 0; ready_text && i < 1000; i++) {
        char *o = e2e_read_file(t->out);
        bool ready = strstr(o, ready_text) != NULL;
        free(o);
        if (ready)
            break;
        e2e_sleep_ms(10);
    }
    return 0;
}

int e2e_target_finish(struct e2e_target *t, int sig)
{
    if (sig)
        kill(t->pid, sig);
    close(t->in);
    int st;
    pid_t r;
    while ((r = waitpid(t->pid, &st, 0)) < 0 && errno == EINTR)
        ;
    if (r != t->pid)
        return -1;
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}
