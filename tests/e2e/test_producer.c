/* tests/e2e/test_producer.c: `heapprofd --producer` against the fake tracing service
 * (tests/producer/fake_traced.h, run as a process), with real programs.
 *
 * Each test starts the fake on a private producer socket and heapprofd --producer on
 * it, starts sessions with a HeapprofdConfig as a Perfetto trace config would carry it,
 * runs programs with the library preloaded, stops the sessions and checks the traces the
 * fake wrote (as traced would: reassembled per writer, validated, stamped): the trace
 * processor's import rules (check_trace), protoc decoding, the values, and that the fake
 * counted no violation of the protocol or of the shared memory ABI.
 *
 * - truth_prog at interval 1 is exact per site, and equal to `heapprof record` of it;
 * - python3 with continuous dumps every 200 ms gives several complete dumps, and a
 *   ClearIncrementalState in the middle restarts the interned data;
 * - a 4 KiB shared memory buffer (one page) carries a dump of megabytes whole;
 * - the fake killed mid-session: heapprofd and the profiled program carry on, the
 *   producer reconnects to a new fake and a new session profiles the program again;
 * - a running target in a container, started without the library, is attached through
 *   a socket made inside its root (root only);
 * - a session stopped while its program runs: the stop is acknowledged, the dump is
 *   complete, the program finishes normally;
 * - two sessions at once: one profiles the process both target, the other records it
 *   as rejected_concurrent and profiles its own;
 * - a fake that stops answering commits: the program is not slowed down (the writers
 *   drop after their stall budget, counted), and losses show in the trace;
 * - an invalid HeapprofdConfig, or one without targets, is refused with a message and
 *   its stop still acknowledged; session fields given as flags are refused.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/clock.h"
#include "common/pbwire.h"
#include "tests/e2e/e2e_daemon.h"
#include "tests/e2e/e2e_util.h"

struct pe {
    char dir[256], traced_sock[320], log[320], fake_log[320];
    struct e2e_daemon d; /* d.sock: the daemon socket the programs connect to */
    pid_t fake, daemon;
    int sessions; /* started in heapprofd */
    int fake_in;
    FILE *fake_out;
};

/* The test's heapprofd and fake traced, killed by the teardown when a failed assertion
 * left them running (a failure jumps past pe_stop()). */
static pid_t g_daemon, g_fake, g_traced, g_perfetto;

static int kill_leftovers(void **state)
{
    (void)state;
    pid_t *pids[] = {&g_daemon, &g_fake, &g_perfetto, &g_traced};
    for (size_t i = 0; i < sizeof(pids) / sizeof(pids[0]); i++) {
        if (*pids[i] > 0) {
            kill(*pids[i], SIGKILL);
            (void)e2e_wait_status(*pids[i]);
        }
        *pids[i] = 0;
    }
    return 0;
}

/* ---- the fake, as a process --------------------------------------------------------- */

static void fake_start(struct pe *pe, const char *const extra[])
{
    int in[2], out[2];
    assert_int_equal(pipe2(in, O_CLOEXEC), 0);
    assert_int_equal(pipe2(out, O_CLOEXEC), 0);
    pe->fake = fork();
    assert_true(pe->fake >= 0);
    if (pe->fake == 0) {
        dup2(in[0], 0);
        dup2(out[1], 1);
        int fd = open(pe->fake_log, O_WRONLY | O_CREAT | O_APPEND, 0644);
        dup2(fd, 2);
        char *argv[16] = {(char *)e2e_env("FAKE_TRACED"), "--socket", pe->traced_sock};
        size_t k = 3;
        for (size_t i = 0; extra && extra[i] && k < 15; i++)
            argv[k++] = (char *)extra[i];
        argv[k] = NULL;
        execv(argv[0], argv);
        _exit(127);
    }
    g_fake = pe->fake;
    close(in[0]);
    close(out[1]);
    pe->fake_in = in[1];
    pe->fake_out = fdopen(out[0], "r");
    char line[256];
    assert_non_null(fgets(line, sizeof(line), pe->fake_out));
    assert_non_null(strstr(line, "listening"));
}

/* Sends a command to the fake and returns its answer (static buffer). */
static const char *fake_cmd(struct pe *pe, const char *fmt, ...)
{
    char cmd[4096];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(cmd, sizeof(cmd) - 1, fmt, ap);
    va_end(ap);
    cmd[n++] = '\n';
    assert_int_equal(write(pe->fake_in, cmd, (size_t)n), n);
    static char line[4096];
    assert_non_null(fgets(line, sizeof(line), pe->fake_out));
    line[strcspn(line, "\n")] = '\0';
    return line;
}

static void fake_kill(struct pe *pe)
{
    kill(pe->fake, SIGKILL);
    (void)e2e_wait_status(pe->fake);
    close(pe->fake_in);
    fclose(pe->fake_out);
    pe->fake = g_fake = 0;
}

static void fake_quit(struct pe *pe)
{
    assert_string_equal(fake_cmd(pe, "quit"), "bye");
    assert_int_equal(e2e_wait_status(pe->fake), 0);
    close(pe->fake_in);
    fclose(pe->fake_out);
    pe->fake = g_fake = 0;
}

/* Asserts that the fake counted no violation; returns its stats line. */
static const char *fake_clean(struct pe *pe)
{
    const char *st = fake_cmd(pe, "stats");
    print_message("fake traced: %s\n", st);
    assert_non_null(strstr(st, " violations=0"));
    return st;
}

static long long stat_of(const char *stats, const char *name)
{
    char key[64];
    snprintf(key, sizeof(key), " %s=", name);
    const char *p = strstr(stats, key);
    return p ? atoll(p + strlen(key)) : 0;
}

/* ---- heapprofd --producer ------------------------------------------------------------ */

static void pe_start(struct pe *pe, const char *tag, const char *const fake_args[])
{
    memset(pe, 0, sizeof(*pe));
    e2e_daemon_prepare(&pe->d, tag);
    snprintf(pe->dir, sizeof(pe->dir), "%s", pe->d.dir);
    snprintf(pe->traced_sock, sizeof(pe->traced_sock), "%s/traced-producer.sock", pe->dir);
    snprintf(pe->log, sizeof(pe->log), "%s/heapprofd.log", pe->dir);
    snprintf(pe->fake_log, sizeof(pe->fake_log), "%s/fake.log", pe->dir);
    fake_start(pe, fake_args);
    pe->daemon = fork();
    assert_true(pe->daemon >= 0);
    if (pe->daemon == 0) {
        int fd = open(pe->log, O_WRONLY | O_CREAT | O_APPEND, 0644);
        dup2(fd, 1);
        dup2(fd, 2);
        setenv("PERFETTO_PRODUCER_SOCK_NAME", pe->traced_sock, 1);
        setenv("HEAPPROF_LOG", "info", 1);
        execl(e2e_env("HEAPPROFD_BIN"), "heapprofd", "--producer", "--socket", pe->d.sock,
              "--no-status", (char *)NULL);
        _exit(127);
    }
    g_daemon = pe->daemon;
    assert_string_equal(fake_cmd(pe, "wait-producer 10000"), "producer ok");
}

static void pe_stop(struct pe *pe)
{
    kill(pe->daemon, SIGTERM);
    int st = e2e_wait_status(pe->daemon);
    g_daemon = 0;
    char *log = e2e_read_file(pe->log);
    if (st != 0)
        print_message("heapprofd log:\n%s\n", log);
    free(log);
    assert_int_equal(st, 0);
    if (pe->fake)
        fake_quit(pe);
}

/* Removes the test's directory (traces, logs, sockets). */
static void pe_remove(struct pe *pe)
{
    char cmd[600];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", pe->dir);
    assert_int_equal(system(cmd), 0);
}

static char *trace_path(struct pe *pe, const char *name)
{
    char *p = malloc(300);
    snprintf(p, 300, "%s/%s.pftrace", pe->dir, name);
    return p;
}

/* ---- HeapprofdConfig, as a trace config carries it ---------------------------------- */

struct hcfg {
    uint8_t b[1024];
    size_t n;
};

static void put_varint(struct hcfg *c, uint64_t v)
{
    c->n += hp_pb_put_varint(c->b + c->n, v);
}

static void cfg_uint(struct hcfg *c, uint32_t field, uint64_t v)
{
    put_varint(c, (uint64_t)field << 3);
    put_varint(c, v);
}

static void cfg_str(struct hcfg *c, uint32_t field, const char *s)
{
    put_varint(c, (uint64_t)field << 3 | 2);
    put_varint(c, strlen(s));
    memcpy(c->b + c->n, s, strlen(s));
    c->n += strlen(s);
}

/* HeapprofdConfig field numbers (Perfetto's). */
enum {
    HC_INTERVAL = 1,
    HC_CMDLINE = 2,
    HC_PID = 4,
    HC_CONTINUOUS = 6,
    HC_BLOCK = 9,
    HC_BLOCK_TIMEOUT = 14,
    HC_ALL_HEAPS = 21,
};

static void cfg_continuous(struct hcfg *c, uint32_t phase_ms, uint32_t interval_ms)
{
    struct hcfg sub = {0};
    cfg_uint(&sub, 5, phase_ms);
    cfg_uint(&sub, 6, interval_ms);
    put_varint(c, (uint64_t)HC_CONTINUOUS << 3 | 2);
    put_varint(c, sub.n);
    memcpy(c->b + c->n, sub.b, sub.n);
    c->n += sub.n;
}

/* A session whose programs wait for the service as long as it takes (dropped samples are
 * not these tests' subject, except where said). */
static struct hcfg cfg_patient(uint64_t interval, const char *name)
{
    struct hcfg c = {0};
    cfg_uint(&c, HC_INTERVAL, interval);
    if (name)
        cfg_str(&c, HC_CMDLINE, name);
    cfg_uint(&c, HC_BLOCK, 1);
    cfg_uint(&c, HC_BLOCK_TIMEOUT, 60000000);
    cfg_uint(&c, HC_ALL_HEAPS, 1);
    return c;
}

/* Waits until heapprofd's log has @count lines containing @a then @b. */
static void wait_lines(struct pe *pe, const char *a, const char *b, int count)
{
    for (int i = 0; i < 3000; i++) { /* 30 s: sanitizer builds are slow */
        char *log = e2e_read_file(pe->log);
        int n = 0;
        for (char *line = strtok(log, "\n"); line; line = strtok(NULL, "\n")) {
            const char *x = strstr(line, a);
            n += x && strstr(x, b);
        }
        free(log);
        if (n >= count)
            return;
        e2e_sleep_ms(10);
    }
    char *log = e2e_read_file(pe->log);
    size_t n = strlen(log);
    /* cmocka's messages hold 4 KiB: the end of the log is what tells. */
    print_message("heapprofd log (end):\n%s\n", log + (n > 3000 ? n - 3000 : 0));
    free(log);
    fail_msg("no '%s...%s' (x%d) in heapprofd's log", a, b, count);
}

/* Starts a session in the fake; returns its index. */
static int start_in_fake(struct pe *pe, const struct hcfg *c, const char *trace)
{
    char hex[2100];
    for (size_t i = 0; i < c->n; i++)
        snprintf(hex + 2 * i, 3, "%02x", c->b[i]);
    const char *r = fake_cmd(pe, "start %s %s", hex, trace);
    int s = -1;
    assert_int_equal(sscanf(r, "session %d", &s), 1);
    assert_true(s >= 0);
    return s;
}

static int start_session(struct pe *pe, const struct hcfg *c, const char *trace)
{
    int s = start_in_fake(pe, c, trace);
    /* The session runs in heapprofd once its log says so. */
    wait_lines(pe, "instance ", ": profiling", ++pe->sessions);
    return s;
}

static void stop_session(struct pe *pe, int s)
{
    const char *r = fake_cmd(pe, "stop %d", s);
    char want[32];
    snprintf(want, sizeof(want), "stop %d ok", s);
    assert_string_equal(r, want);
}

static void check_protoc(const char *trace)
{
    assert_int_equal(e2e_check_protoc(trace), 0);
}

/* Reads a trace back, after protoc decoded it and, unless it is known to have lost
 * packets (a gap in the indices breaks a rule on purpose), check_trace passed it. */
static struct rp_trace *load_checked(const char *trace, bool lossy)
{
    struct rp_trace *t = NULL;
    assert_int_equal(rp_trace_load(trace, &(struct rp_trace_options){0}, &t), 0);
    if (!lossy)
        assert_int_equal(e2e_check_rules(trace), 0);
    check_protoc(trace);
    return t;
}

static struct rp_trace *load(const char *trace)
{
    return load_checked(trace, false);
}

/* Counts, in a trace, packets with previous_packet_dropped = 257 (a writer's loss),
 * process dumps with rejected_concurrent for @pid, and gaps in ProfilePacket.index. */
struct scan {
    unsigned losses, rejected, index_gaps, sequences_cleared;
};

static void scan_trace(const char *path, pid_t pid, struct scan *ret)
{
    memset(ret, 0, sizeof(*ret));
    char *buf = NULL;
    size_t len = 0;
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    buf = malloc(64 << 20);
    len = fread(buf, 1, 64 << 20, f);
    fclose(f);
    struct hp_pb_iter it, pi, qi, di;
    struct hp_pb_field p, q, r, d;
    uint64_t next_index = 0;
    bool any = false;
    hp_pb_iter_init(&it, buf, len);
    while (hp_pb_next(&it, &p)) {
        hp_pb_iter_init(&pi, p.ptr, p.len);
        while (hp_pb_next(&pi, &q)) {
            if (q.num == 42 && q.varint == 257)
                ret->losses++;
            if (q.num == 13 && (q.varint & 1))
                ret->sequences_cleared++;
            if (q.num != 37)
                continue;
            hp_pb_iter_init(&qi, q.ptr, q.len);
            while (hp_pb_next(&qi, &r)) {
                if (r.num == 7) {
                    if (any && r.varint != next_index)
                        ret->index_gaps++;
                    next_index = r.varint + 1;
                    any = true;
                }
                if (r.num != 5)
                    continue;
                uint64_t dpid = 0;
                bool rej = false;
                hp_pb_iter_init(&di, r.ptr, r.len);
                while (hp_pb_next(&di, &d)) {
                    if (d.num == 1)
                        dpid = d.varint;
                    if (d.num == 4 && d.varint)
                        rej = true;
                }
                ret->rejected += rej && dpid == (uint64_t)pid;
            }
        }
    }
    free(buf);
}

static struct e2e_run run_record(const char *interval, char *const prog[], char **ret_trace)
{
    char *trace = e2e_tmp_path(".pftrace");
    char *argv[32] = {(char *)e2e_env("HEAPPROF_BIN"),
                      "record",
                      "-q",
                      "-o",
                      trace,
                      "-i",
                      (char *)interval,
                      "--block-timeout-us",
                      "60000000",
                      "--"};
    size_t k = 10;
    for (size_t i = 0; prog[i] && k < 31; i++)
        argv[k++] = prog[i];
    argv[k] = NULL;
    struct e2e_run run;
    assert_int_equal(e2e_run(argv, NULL, &run), 0);
    assert_int_equal(run.status, 0);
    *ret_trace = trace;
    return run;
}

/* ---- tests -------------------------------------------------------------------------- */

static void totals(const struct rp_trace_process *p, uint64_t v[4])
{
    memset(v, 0, 4 * sizeof(*v));
    for (size_t c = 0; c < p->n_callsites; c++) {
        v[0] += p->callsites[c].self_allocated;
        v[1] += p->callsites[c].alloc_count;
        v[2] += p->callsites[c].self_freed;
        v[3] += p->callsites[c].free_count;
    }
}

static void test_producer_truth_exact(void **state)
{
    (void)state;
    struct pe pe;
    static const char *const fake_args[] = {"--shuffle-methods", NULL};
    pe_start(&pe, "prod-truth", fake_args);
    char *trace = trace_path(&pe, "truth");
    struct hcfg c = cfg_patient(1, "truth_prog");
    int s = start_session(&pe, &c, trace);
    /* The geometry heapprofd hints at, which traced (and the fake) follow. */
    wait_lines(&pe, "shared memory buffer of 1024 KiB", "in 16 KiB pages", 1);
    char *out = e2e_tmp_path(".out");
    char *prog[] = {(char *)e2e_env("TRUTH_PROG"), "1", NULL};
    pid_t pid = e2e_spawn_client(&pe.d, prog, out);
    assert_int_equal(e2e_wait_status(pid), 0);
    stop_session(&pe, s);
    fake_clean(&pe);
    pe_stop(&pe);

    struct rp_trace *t = load(trace);
    const struct rp_trace_process *p = e2e_find_pid(t, pid);
    assert_non_null(p);
    assert_int_equal(p->sampling_interval_bytes, 1);
    assert_true(p->from_startup);
    assert_false(p->buffer_overran);
    char *truth = e2e_read_file(out);
    e2e_check_exact_sites(p, truth);

    /* The same program recorded standalone: the same figures, site by site and in all. */
    char *st_trace;
    struct e2e_run run = run_record("1", prog, &st_trace);
    struct rp_trace *st = load(st_trace);
    const struct rp_trace_process *sp = e2e_find_process(st, "truth_prog");
    assert_non_null(sp);
    struct e2e_truth tr[E2E_MAX_TRUTH];
    size_t nt = e2e_parse_truth(truth, tr, E2E_MAX_TRUTH);
    assert_true(nt >= 12);
    for (size_t i = 0; i < nt; i++) {
        struct e2e_sums a, b;
        e2e_sum_function(p, tr[i].name, &a);
        e2e_sum_function(sp, tr[i].name, &b);
        assert_memory_equal(&a, &b, sizeof(a));
    }
    uint64_t va[4], vb[4];
    totals(p, va);
    totals(sp, vb);
    print_message("producer: %llu bytes in %llu allocations; standalone: %llu in %llu\n",
                  (unsigned long long)va[0], (unsigned long long)va[1], (unsigned long long)vb[0],
                  (unsigned long long)vb[1]);
    assert_memory_equal(va, vb, sizeof(va));
    assert_int_equal(p->n_callsites, sp->n_callsites);
    e2e_run_free(&run);
    rp_trace_free(st);
    unlink(st_trace);
    free(st_trace);
    rp_trace_free(t);
    free(truth);
    unlink(out);
    free(out);
    free(trace);
    pe_remove(&pe);
}

static void test_producer_python_continuous(void **state)
{
    (void)state;
    if (access("/usr/bin/python3", X_OK) != 0)
        skip();
    struct pe pe;
    pe_start(&pe, "prod-py", NULL);
    char *trace = trace_path(&pe, "python");
    struct hcfg c = cfg_patient(4096, "python3");
    cfg_continuous(&c, 100, 200);
    int s = start_session(&pe, &c, trace);
    char *prog[] = {"/usr/bin/python3", "-c",
                    "import time\n"
                    "d = {}\n"
                    "for r in range(12):\n"
                    "    for i in range(20000):\n"
                    "        d['k%d_%d' % (r, i)] = 'v' * (520 + i % 300)\n"
                    "    time.sleep(0.1)\n"
                    "print(len(d))\n",
                    NULL};
    pid_t pid = e2e_spawn_client(&pe.d, prog, "/dev/null");
    /* Mid-run, traced asks for the interned data again (as it does for ring buffers):
     * the dumps after it must stand on their own (check_trace starts its tables afresh
     * at SEQ_INCREMENTAL_STATE_CLEARED). */
    e2e_sleep_ms(700);
    char want[32];
    snprintf(want, sizeof(want), "clear %d", s);
    assert_string_equal(fake_cmd(&pe, "clear %d", s), want);
    assert_int_equal(e2e_wait_status(pid), 0);
    stop_session(&pe, s);
    fake_clean(&pe);
    pe_stop(&pe);
    struct scan sc;
    scan_trace(trace, pid, &sc);
    /* traced's clock snapshot, the sequence's start, the restart */
    assert_int_equal(sc.sequences_cleared, 3);
    struct rp_trace *t = load(trace);
    const struct rp_trace_process *p = e2e_find_pid(t, pid);
    assert_non_null(p);
    print_message("python3: %u dumps, %zu callsites\n", p->n_dumps, p->n_callsites);
    assert_true(p->n_dumps >= 3);
    assert_true(p->n_callsites > 10);
    rp_trace_free(t);
    free(trace);
    pe_remove(&pe);
}

/* One 4 KiB page of shared memory for a dump of megabytes (32768 call sites, each packet
 * of up to 400 KB through one chunk at a time). */
static void test_producer_tiny_smb(void **state)
{
    (void)state;
    struct pe pe;
    static const char *const fake_args[] = {"--smb-kb", "4", "--page-kb", "4", NULL};
    pe_start(&pe, "prod-tiny", fake_args);
    char *trace = trace_path(&pe, "tiny");
    struct hcfg c = cfg_patient(1, "many_sites");
    int s = start_session(&pe, &c, trace);
    char *prog[] = {(char *)e2e_env("MANY_SITES"), "15", NULL};
    pid_t pid = e2e_spawn_client(&pe.d, prog, "/dev/null");
    assert_int_equal(e2e_wait_status(pid), 0);
    /* Its records all read: a stop gives an ending process 400 ms, which a loaded
     * machine running TSan's build needs more than for 32768 stacks (a stressed run lost
     * some). */
    char who[32];
    snprintf(who, sizeof(who), "pid %d (", (int)pid);
    wait_lines(&pe, who, "): ended", 1);
    stop_session(&pe, s);
    const char *st = fake_clean(&pe);
    long long chunks = stat_of(st, "chunks_read");
    pe_stop(&pe);
    struct stat sb;
    assert_int_equal(stat(trace, &sb), 0);
    print_message("trace of %lld bytes through %lld chunks of one 4 KiB page\n",
                  (long long)sb.st_size, chunks);
    assert_true(sb.st_size > (1 << 20));
    struct rp_trace *t = load(trace);
    const struct rp_trace_process *p = e2e_find_pid(t, pid);
    assert_non_null(p);
    assert_int_equal(p->n_dumps, 1);
    assert_true(p->n_callsites >= 32768); /* and stdio's buffer */
    struct scan sc;
    scan_trace(trace, pid, &sc);
    assert_int_equal(sc.losses, 0);
    assert_int_equal(sc.index_gaps, 0);
    rp_trace_free(t);
    free(trace);
    pe_remove(&pe);
}

/* The fake is killed while a program is profiled: heapprofd and the program carry on;
 * heapprofd reconnects to a new fake, whose new session attaches the program again. */
static void test_producer_traced_restart(void **state)
{
    (void)state;
    struct pe pe;
    pe_start(&pe, "prod-restart", NULL);
    char *trace1 = trace_path(&pe, "first"), *trace2 = trace_path(&pe, "second");
    struct hcfg c = cfg_patient(1, "worker"); /* every allocation: no chance */
    (void)start_session(&pe, &c, trace1);
    /* "idle": a leaked block every 100 ms. (A program that allocates faster than the
     * service unwinds keeps a session from ending until it exits: the service drains a
     * ring to empty before it lets its client go.) */
    char *prog[] = {(char *)e2e_env("WORKER"), "idle", "5000", NULL};
    pid_t pid = e2e_spawn_client(&pe.d, prog, "/dev/null");
    wait_lines(&pe, "pid ", ": profiling", 1);
    e2e_sleep_ms(300);
    fake_kill(&pe);
    wait_lines(&pe, "connection to", "lost", 1);
    assert_int_equal(kill(pe.daemon, 0), 0);
    assert_int_equal(kill(pid, 0), 0);
    fake_start(&pe, NULL);
    assert_string_equal(fake_cmd(&pe, "wait-producer 10000"), "producer ok");
    /* The old session has ended: the program is dormant again, and the new session
     * wakes it (a ptrace call of its wake entry). */
    wait_lines(&pe, "session 1 ended", "", 1);
    int s = start_session(&pe, &c, trace2);
    wait_lines(&pe, "woken to attach", "", 1);
    wait_lines(&pe, "pid ", ": profiling", 2);
    assert_int_equal(e2e_wait_status(pid), 0);
    stop_session(&pe, s);
    fake_clean(&pe);
    pe_stop(&pe);
    struct rp_trace *t = load(trace2);
    const struct rp_trace_process *p = e2e_find_pid(t, pid);
    assert_non_null(p);
    assert_false(p->from_startup);
    struct e2e_sums sums;
    e2e_sum_function(p, "worker_leak", &sums);
    assert_true(sums.alloc_count > 0);
    rp_trace_free(t);
    free(trace1);
    free(trace2);
    pe_remove(&pe);
}

/* A program started without the library, already running when the session starts: the
 * data source loads libheapprof.so into it (service/inject.c), and profiles it from then
 * on, as heapprofd does its running targets. */
static void test_producer_injects_running_target(void **state)
{
    (void)state;
    struct pe pe;
    pe_start(&pe, "prod-inject", NULL);
    char *trace = trace_path(&pe, "inject");
    struct hcfg c = cfg_patient(1, "worker");
    char *prog[] = {(char *)e2e_env("WORKER"), "idle", "3000", NULL};
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        int fd = open("/dev/null", O_WRONLY);
        dup2(fd, 1);
        unsetenv("LD_PRELOAD");
        /* Where the loaded client finds the daemon (its environment is read when the
         * library is loaded). */
        setenv("HEAPPROF_SOCKET", pe.d.sock, 1);
        execv(prog[0], prog);
        _exit(127);
    }
    e2e_sleep_ms(200);
    int s = start_session(&pe, &c, trace);
    wait_lines(&pe, "pid ", ": profiling", 1);
    assert_int_equal(e2e_wait_status(pid), 0);
    stop_session(&pe, s);
    fake_clean(&pe);
    pe_stop(&pe);
    check_protoc(trace);
    struct rp_trace *t = load(trace);
    const struct rp_trace_process *p = e2e_find_pid(t, pid);
    assert_non_null(p);
    assert_false(p->from_startup);
    struct e2e_sums sums;
    e2e_sum_function(p, "worker_leak", &sums);
    assert_true(sums.alloc_count > 0);
    rp_trace_free(t);
    free(trace);
    pe_remove(&pe);
}

/* Sockets of ours (heapprof-*.sock) left in the /tmp of @pid's root. */
static int sockets_in_root(pid_t pid)
{
    char path[64];
    snprintf(path, sizeof(path), "/proc/%d/root/tmp", (int)pid);
    DIR *d = opendir(path);
    assert_non_null(d);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        size_t len = strlen(e->d_name);
        n += strncmp(e->d_name, "heapprof-", 9) == 0 && len > 14 &&
             strcmp(e->d_name + len - 5, ".sock") == 0;
    }
    closedir(d);
    return n;
}

/* A running target in a container (its own mount, pid and network namespaces, a /tmp of
 * its own: the daemon's socket, the abstract ones and the library's directory out of its
 * sight), started without the library: the session's scan injects it and it connects to a
 * socket made for that session inside its root. Root only. */
static void test_producer_container_target(void **state)
{
    (void)state;
    if (geteuid() != 0 || access("/usr/bin/unshare", X_OK) != 0) {
        print_message("not root, or no unshare (namespaces): skipped\n");
        skip();
    }
    struct pe pe;
    pe_start(&pe, "prod-ctr", NULL);
    char lib_dir[512], script[2048];
    snprintf(lib_dir, sizeof(lib_dir), "%s", e2e_env("HEAPPROF_LIB"));
    *strrchr(lib_dir, '/') = '\0';
    /* The library's directory first: the build may be under /tmp. */
    snprintf(script, sizeof(script),
             "exec /usr/bin/unshare --mount --pid --net --fork --mount-proc /bin/sh -c \""
             "mount -t tmpfs hide '%s' && mount -t tmpfs tmp /tmp && exec '%s'\"",
             lib_dir, e2e_env("INJECT_THREADS"));
    char *argv[] = {"/bin/sh", "-c", script, NULL};
    struct e2e_target t;
    assert_int_equal(e2e_target_start(&t, pe.dir, argv, NULL, "ready"), 0);
    char path[96];
    snprintf(path, sizeof(path), "/proc/%d/task/%d/children", (int)t.pid, (int)t.pid);
    char *kids = e2e_read_file(path);
    pid_t pid = (pid_t)atoi(kids); /* unshare --fork's child: the program, by its host pid */
    free(kids);
    assert_true(pid > 0);

    char *trace = trace_path(&pe, "ctr");
    struct hcfg c = cfg_patient(4096, "inject_threads");
    int s = start_session(&pe, &c, trace);
    char want[32];
    snprintf(want, sizeof(want), "pid %d (", (int)pid);
    wait_lines(&pe, want, "): profiling", 1);
    assert_int_equal(sockets_in_root(pid), 0); /* taken by its connection */
    e2e_sleep_ms(300);                         /* each thread allocates every ms */
    stop_session(&pe, s);
    fake_clean(&pe);
    pe_stop(&pe);
    assert_int_equal(sockets_in_root(pid), 0);
    struct rp_trace *tr = load(trace);
    const struct rp_trace_process *p = e2e_find_pid(tr, pid);
    assert_non_null(p);
    for (int k = 0; k < 4; k++) {
        char site[16];
        snprintf(site, sizeof(site), "site_t%d", k);
        struct e2e_sums sums;
        e2e_sum_function(p, site, &sums);
        assert_true(sums.alloc_count > 0);
    }
    rp_trace_free(tr);
    assert_int_equal(e2e_target_finish(&t, 0), 0);
    char *o = e2e_read_file(t.out);
    assert_null(strstr(o, "FATAL"));
    assert_non_null(strstr(o, "done"));
    free(o);
    free(trace);
    pe_remove(&pe);
}

/* A session stopped while its program runs: acknowledged at once (final dump included),
 * and the program goes on unprofiled to a normal end. */
static void test_producer_stopped_early(void **state)
{
    (void)state;
    struct pe pe;
    pe_start(&pe, "prod-early", NULL);
    char *trace = trace_path(&pe, "early");
    struct hcfg c = cfg_patient(1, "worker"); /* every allocation: no chance */
    int s = start_session(&pe, &c, trace);
    char *prog[] = {(char *)e2e_env("WORKER"), "idle", "2500", NULL};
    pid_t pid = e2e_spawn_client(&pe.d, prog, "/dev/null");
    wait_lines(&pe, "pid ", ": profiling", 1);
    /* `heapprof dump` reaches a producer daemon through its socket as well. */
    char *dump[] = {(char *)e2e_env("HEAPPROF_BIN"), "dump", "--socket", pe.d.sock, NULL};
    struct e2e_run run;
    assert_int_equal(e2e_run(dump, NULL, &run), 0);
    print_message("heapprof dump: %s", run.err);
    assert_int_equal(run.status, 0);
    assert_non_null(strstr(run.err, "asked heapprofd"));
    e2e_run_free(&run);
    e2e_sleep_ms(500);
    uint64_t t0 = hp_clock_ns(CLOCK_MONOTONIC);
    stop_session(&pe, s);
    uint64_t ms = (hp_clock_ns(CLOCK_MONOTONIC) - t0) / 1000000;
    print_message("stop acknowledged in %llu ms (flush included)\n", (unsigned long long)ms);
    assert_true(ms < 5000);
    assert_int_equal(kill(pid, 0), 0); /* still running */
    assert_int_equal(e2e_wait_status(pid), 0);
    fake_clean(&pe);
    pe_stop(&pe);
    struct rp_trace *t = load(trace);
    const struct rp_trace_process *p = e2e_find_pid(t, pid);
    assert_non_null(p);
    struct e2e_sums sums;
    e2e_sum_function(p, "worker_leak", &sums);
    assert_true(sums.alloc_count > 0);
    rp_trace_free(t);
    free(trace);
    pe_remove(&pe);
}

/* Two sessions at once. A targets three_sites; B targets three_sites and truth_prog:
 * three_sites is A's (B records it as rejected_concurrent), truth_prog is B's. */
static void test_producer_two_sessions(void **state)
{
    (void)state;
    struct pe pe;
    pe_start(&pe, "prod-two", NULL);
    char *ta = trace_path(&pe, "a"), *tb = trace_path(&pe, "b");
    struct hcfg ca = cfg_patient(1, "three_sites");
    struct hcfg cb = cfg_patient(1, "three_sites");
    cfg_str(&cb, HC_CMDLINE, "truth_prog");
    int a = start_session(&pe, &ca, ta);
    int b = start_session(&pe, &cb, tb);
    char *p1[] = {(char *)e2e_env("THREE_SITES"), NULL};
    char *p2[] = {(char *)e2e_env("TRUTH_PROG"), "1", NULL};
    char *out = e2e_tmp_path(".out");
    pid_t pid1 = e2e_spawn_client(&pe.d, p1, "/dev/null");
    pid_t pid2 = e2e_spawn_client(&pe.d, p2, out);
    assert_int_equal(e2e_wait_status(pid1), 0);
    assert_int_equal(e2e_wait_status(pid2), 0);
    stop_session(&pe, a);
    stop_session(&pe, b);
    fake_clean(&pe);
    pe_stop(&pe);
    struct rp_trace *t = load(ta);
    assert_non_null(e2e_find_pid(t, pid1));
    assert_null(e2e_find_pid(t, pid2));
    rp_trace_free(t);
    struct scan sc;
    scan_trace(tb, pid1, &sc);
    assert_int_equal(sc.rejected, 1);
    t = load(tb);
    const struct rp_trace_process *p = e2e_find_pid(t, pid2);
    assert_non_null(p);
    char *truth = e2e_read_file(out);
    e2e_check_exact_sites(p, truth);
    free(truth);
    rp_trace_free(t);
    unlink(out);
    free(out);
    free(ta);
    free(tb);
    pe_remove(&pe);
}

/* The fake stops answering commits while a program with continuous dumps runs: the
 * program runs at its usual speed (the SMB never blocks it: only the bookkeeping thread
 * waits, 2 s per packet, then drops it), and the losses show in the trace: a packet with
 * previous_packet_dropped (and a gap in the ProfilePacket indices when one was lost). */
static void test_producer_full_smb_never_blocks(void **state)
{
    (void)state;
#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
    /* Under TSan the one unwinder thread reads the flat-out worker's ring about ten times
     * slower, and each continuous dump waits for it to drain up to the request: no dump
     * comes while the worker runs, so the page never fills and the final dump (a few
     * callsites) fits in it. Under ASan the same happens on a busy machine (seen beside
     * other test runs: no dump failed). The main build runs this. */
    skip();
#endif
    char *prog[] = {(char *)e2e_env("WORKER"), "busy", "1500", NULL};
    struct pe pe;
    static const char *const fake_args[] = {"--smb-kb", "4", "--page-kb", "4", NULL};
    pe_start(&pe, "prod-full", fake_args);
    char *trace = trace_path(&pe, "full");
    struct hcfg c = {0};
    cfg_uint(&c, HC_INTERVAL, 4096);
    cfg_str(&c, HC_CMDLINE, "worker");
    cfg_continuous(&c, 0, 50); /* the one page fills within a second */
    int s = start_session(&pe, &c, trace);
    assert_string_equal(fake_cmd(&pe, "stall on"), "stall on");
    uint64_t t0 = hp_clock_ns(CLOCK_MONOTONIC);
    pid_t pid = e2e_spawn_client(&pe.d, prog, "/dev/null");
    assert_int_equal(e2e_wait_status(pid), 0);
    uint64_t ms = (hp_clock_ns(CLOCK_MONOTONIC) - t0) / 1000000;
    print_message("worker (1500 ms of work) ran %llu ms while traced stalled\n",
                  (unsigned long long)ms);
    assert_true(ms < 4000);
    /* A packet waits 2 s for a chunk, then is dropped: the dump it belongs to fails. */
    wait_lines(&pe, "dump failed: ", "No buffer space", 1);
    assert_string_equal(fake_cmd(&pe, "stall off"), "stall off");
    stop_session(&pe, s);
    fake_clean(&pe);
    pe_stop(&pe);
    struct scan sc;
    scan_trace(trace, pid, &sc);
    print_message("losses marked: %u, index gaps: %u, sequence restarts: %u\n", sc.losses,
                  sc.index_gaps, sc.sequences_cleared);
    assert_true(sc.losses >= 1);
    /* The packet dropped is a ProfilePacket (a gap in the indices) or one of the dump's
     * ModuleSymbols packets, which dumps write for frames whose lines were read
     * meanwhile: either way the dump failed and said so above. */
    print_message("index gaps: %u\n", sc.index_gaps);
    /* traced's clock snapshot, the sequence's start, and the restart after the loss. */
    assert_true(sc.sequences_cleared >= 3);
    struct rp_trace *t = load_checked(trace, true);
    const struct rp_trace_process *p = e2e_find_pid(t, pid);
    assert_non_null(p);
    rp_trace_free(t);
    free(trace);
    pe_remove(&pe);
}

/* A trace config heapprof cannot honour is refused with a message, and the session goes
 * on without it; flags that belong to each session's config are refused at start. */
static void test_producer_bad_config(void **state)
{
    (void)state;
    struct pe pe;
    pe_start(&pe, "prod-bad", NULL);
    char *trace = trace_path(&pe, "bad");
    struct hcfg c = {0};
    cfg_uint(&c, HC_INTERVAL, 0);
    cfg_str(&c, HC_CMDLINE, "worker");
    int a = start_in_fake(&pe, &c, trace);
    wait_lines(&pe, "instance 1 refused: ", "sampling_interval_bytes must be at least 1", 1);
    struct hcfg none = {0};
    cfg_uint(&none, HC_INTERVAL, 4096);
    int b = start_in_fake(&pe, &none, trace);
    wait_lines(&pe, "instance 2 refused: ", "names no process", 1);
    stop_session(&pe, a);
    stop_session(&pe, b);
    fake_clean(&pe);
    pe_stop(&pe);

    char *argv[] = {(char *)e2e_env("HEAPPROFD_BIN"), "--producer", "-n", "myapp", NULL};
    struct e2e_run run;
    assert_int_equal(e2e_run(argv, NULL, &run), 0);
    assert_int_equal(run.status, 2);
    assert_non_null(strstr(run.err, "heapprofd_config"));
    e2e_run_free(&run);
    free(trace);
    pe_remove(&pe);
}

/* ---- the real traced ------------------------------------------------------------------ */

/* Perfetto's own @name (traced, perfetto) beside the trace processor the build found, or
 * NULL when it is absent (a fresh clone has no sibling shared/perfetto). */
static const char *perfetto_tool(const char *name, char *buf, size_t len)
{
    const char *tp = getenv("TRACE_PROCESSOR");
    const char *slash = tp ? strrchr(tp, '/') : NULL;
    if (!slash)
        return NULL;
    snprintf(buf, len, "%.*s/%s", (int)(slash - tp), tp, name);
    return access(buf, X_OK) == 0 ? buf : NULL;
}

/* Forks @argv with the producer and consumer sockets of @dir, output to @log. */
static pid_t spawn_perfetto(const char *dir, const char *log, char *const argv[])
{
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        char p[320], c[320];
        snprintf(p, sizeof(p), "%s/p.sock", dir);
        snprintf(c, sizeof(c), "%s/c.sock", dir);
        setenv("PERFETTO_PRODUCER_SOCK_NAME", p, 1);
        setenv("PERFETTO_CONSUMER_SOCK_NAME", c, 1);
        int fd = open(log, O_WRONLY | O_CREAT | O_APPEND, 0644);
        dup2(fd, 1);
        dup2(fd, 2);
        execv(argv[0], argv);
        _exit(127);
    }
    return pid;
}

static void wait_file(const char *path)
{
    struct stat st;
    for (int i = 0; i < 1000 && stat(path, &st) != 0; i++)
        e2e_sleep_ms(10);
    assert_int_equal(stat(path, &st), 0);
}

/* The whole chain with Perfetto's own binaries, where present: traced, heapprofd
 * --producer registered with it, the perfetto command line as the consumer with a text
 * config asking for android.heapprofd on truth_prog at interval 1, the program run,
 * perfetto stopped with SIGINT (as a user's Ctrl-C). The trace it writes is exact per
 * site and reads in the trace processor with no error stat. */
static void test_producer_real_traced(void **state)
{
    (void)state;
    char traced_bin[4200], perfetto_bin[4200];
    if (!perfetto_tool("traced", traced_bin, sizeof(traced_bin)) ||
        !perfetto_tool("perfetto", perfetto_bin, sizeof(perfetto_bin))) {
        print_message("  Perfetto's traced and perfetto are absent: not tested\n");
        skip();
    }
    struct pe pe;
    memset(&pe, 0, sizeof(pe));
    e2e_daemon_prepare(&pe.d, "prod-real");
    snprintf(pe.dir, sizeof(pe.dir), "%s", pe.d.dir);
    snprintf(pe.log, sizeof(pe.log), "%s/heapprofd.log", pe.dir);
    char traced_log[320], perfetto_log[320], cfg_path[320], psock[320];
    snprintf(traced_log, sizeof(traced_log), "%s/traced.log", pe.dir);
    snprintf(perfetto_log, sizeof(perfetto_log), "%s/perfetto.log", pe.dir);
    snprintf(cfg_path, sizeof(cfg_path), "%s/config.txt", pe.dir);
    snprintf(psock, sizeof(psock), "%s/p.sock", pe.dir);

    char *traced_argv[] = {traced_bin, NULL};
    g_traced = spawn_perfetto(pe.dir, traced_log, traced_argv);
    wait_file(psock);
    pe.daemon = fork();
    assert_true(pe.daemon >= 0);
    if (pe.daemon == 0) {
        int fd = open(pe.log, O_WRONLY | O_CREAT | O_APPEND, 0644);
        dup2(fd, 1);
        dup2(fd, 2);
        setenv("PERFETTO_PRODUCER_SOCK_NAME", psock, 1);
        setenv("HEAPPROF_LOG", "info", 1);
        execl(e2e_env("HEAPPROFD_BIN"), "heapprofd", "--producer", "--socket", pe.d.sock,
              "--no-status", (char *)NULL);
        _exit(127);
    }
    g_daemon = pe.daemon;
    wait_lines(&pe, "producer: connected to", "registered", 1);

    FILE *f = fopen(cfg_path, "w");
    assert_non_null(f);
    fprintf(f, "buffers { size_kb: 32768 fill_policy: DISCARD }\n"
               "data_sources { config { name: \"android.heapprofd\" heapprofd_config {\n"
               "  sampling_interval_bytes: 1 process_cmdline: \"truth_prog\"\n"
               "  block_client: true block_client_timeout_us: 60000000 all_heaps: true\n"
               "} } }\n"
               "duration_ms: 120000\n");
    fclose(f);
    char *trace = trace_path(&pe, "real");
    char *perfetto_argv[] = {perfetto_bin, "--txt", "-c", cfg_path, "-o", trace, NULL};
    g_perfetto = spawn_perfetto(pe.dir, perfetto_log, perfetto_argv);
    wait_lines(&pe, "instance ", ": profiling", 1);

    char *out = e2e_tmp_path(".out");
    char *prog[] = {(char *)e2e_env("TRUTH_PROG"), "1", NULL};
    pid_t pid = e2e_spawn_client(&pe.d, prog, out);
    assert_int_equal(e2e_wait_status(pid), 0);
    /* Every record read before the stop: the stop gives what is left a short budget. */
    wait_lines(&pe, "(truth_prog): ended", "", 1);
    kill(g_perfetto, SIGINT);
    int st = e2e_wait_status(g_perfetto);
    g_perfetto = 0;
    if (st != 0) {
        char *log = e2e_read_file(perfetto_log);
        print_message("perfetto: status %d\n%s\n", st, log);
        free(log);
    }
    assert_int_equal(st, 0);
    pe_stop(&pe);
    kill(g_traced, SIGTERM);
    (void)e2e_wait_status(g_traced);
    g_traced = 0;

    struct rp_trace *t = load(trace);
    const struct rp_trace_process *p = e2e_find_pid(t, pid);
    assert_non_null(p);
    assert_int_equal(p->sampling_interval_bytes, 1);
    char *truth = e2e_read_file(out);
    e2e_check_exact_sites(p, truth);
    uint64_t v[4];
    totals(p, v);
    print_message("real traced: %llu bytes in %llu allocations of truth_prog\n",
                  (unsigned long long)v[0], (unsigned long long)v[1]);
    rp_trace_free(t);
    free(truth);
    unlink(out);
    free(out);
    free(trace);
    pe_remove(&pe);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_producer_truth_exact, kill_leftovers),
        cmocka_unit_test_teardown(test_producer_python_continuous, kill_leftovers),
        cmocka_unit_test_teardown(test_producer_tiny_smb, kill_leftovers),
        cmocka_unit_test_teardown(test_producer_traced_restart, kill_leftovers),
        cmocka_unit_test_teardown(test_producer_injects_running_target, kill_leftovers),
        cmocka_unit_test_teardown(test_producer_container_target, kill_leftovers),
        cmocka_unit_test_teardown(test_producer_stopped_early, kill_leftovers),
        cmocka_unit_test_teardown(test_producer_two_sessions, kill_leftovers),
        cmocka_unit_test_teardown(test_producer_full_smb_never_blocks, kill_leftovers),
        cmocka_unit_test_teardown(test_producer_bad_config, kill_leftovers),
        cmocka_unit_test_teardown(test_producer_real_traced, kill_leftovers),
    };
    return cmocka_run_group_tests_name("e2e_producer", tests, NULL, NULL);
}
