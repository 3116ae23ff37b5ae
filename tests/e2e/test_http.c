/* tests/e2e/test_http.c: heapprofd --http with a real program (three_sites, exact at
 * -i 1, holding its allocations).
 *
 *   test_http robust   raw sockets: every answer the endpoint gives (pprof by pid and by
 *                      name, HEAD, the index, 400/404/405/431/505), then 100 slow clients
 *                      (silent, half a request, never reading) while the daemon's dumps go
 *                      on at their period and a good request is answered within a bound
 *   test_http go       `go tool pprof -top` over HTTP shows the program's known bytes
 *                      (skipped without go; slow to start: suites e2e and no-asan)
 */
/* cmocka.h needs these first. */
// clang-format off
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
// clang-format on

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "tests/e2e/e2e_daemon.h"
#include "tests/e2e/e2e_util.h"

struct fixture {
    struct e2e_daemon d;
    unsigned port;
    pid_t prog;
    char out[300]; /* the program's stdout: its truth */
};

static long now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int connect_port(unsigned port)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    assert_true(fd >= 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof(a)), 0);
    return fd;
}

struct answer {
    int status;
    char *head; /* malloc'd, the whole answer */
    size_t len;
    const char *body;
    size_t body_len;
};

/* Sends @req (@len bytes) on a new connection and reads the answer until the server
 * closes, within @timeout_ms (fails the test past it). */
static struct answer ask_raw(unsigned port, const char *req, size_t len, long timeout_ms)
{
    int fd = connect_port(port);
    for (size_t off = 0; off < len;) {
        ssize_t w = send(fd, req + off, len - off, MSG_NOSIGNAL);
        if (w <= 0)
            break; /* the server may answer and close before it read all of it */
        off += (size_t)w;
    }
    struct answer a = {0};
    size_t cap = 0;
    long end = now_ms() + timeout_ms;
    for (;;) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        long left = end - now_ms();
        if (left <= 0 || poll(&p, 1, (int)left) <= 0)
            fail_msg("no answer within %ld ms to '%.40s'", timeout_ms, req);
        if (a.len + 65536 > cap) {
            cap = (a.len + 65536) * 2;
            a.head = realloc(a.head, cap + 1);
            assert_non_null(a.head);
        }
        ssize_t n = recv(fd, a.head + a.len, cap - a.len, 0);
        if (n < 0 && errno == ECONNRESET)
            break;
        assert_true(n >= 0);
        if (n == 0)
            break;
        a.len += (size_t)n;
    }
    close(fd);
    assert_non_null(a.head);
    a.head[a.len] = '\0';
    assert_int_equal(sscanf(a.head, "HTTP/1.1 %d ", &a.status), 1);
    const char *sep = strstr(a.head, "\r\n\r\n");
    assert_non_null(sep);
    a.body = sep + 4;
    a.body_len = a.len - (size_t)(a.body - a.head);
    return a;
}

static struct answer ask(unsigned port, const char *req)
{
    return ask_raw(port, req, strlen(req), 5000);
}

static struct answer get(unsigned port, const char *target)
{
    char req[512];
    snprintf(req, sizeof(req), "GET %s HTTP/1.1\r\nHost: x\r\n\r\n", target);
    return ask(port, req);
}

/* The answer to @req has @status and a body holding @needle (NULL: not checked). */
static void expect(unsigned port, const char *req, int status, const char *needle)
{
    struct answer a = ask(port, req);
    if (a.status != status || (needle && !strstr(a.body, needle)))
        fail_msg("'%.60s': got %d '%s', wanted %d '%s'", req, a.status, a.body, status,
                 needle ? needle : "");
    free(a.head);
}

/* Samples of @pid the daemon has, from its index page; -1 when it is not listed. */
static long long samples_of(unsigned port, pid_t pid)
{
    struct answer a = get(port, "/");
    assert_int_equal(a.status, 200);
    /* <tr><td class=n>PID</td><td>TITLE</td><td class=n>SAMPLES</td>... */
    char head[64];
    snprintf(head, sizeof(head), "<tr><td class=n>%d</td>", (int)pid);
    const char *row = strstr(a.body, head);
    const char *cell = row ? strstr(row + strlen(head), "<td class=n>") : NULL;
    long long n = cell ? strtoll(cell + strlen("<td class=n>"), NULL, 10) : -1;
    free(a.head);
    return n;
}

/* Starts heapprofd --http 127.0.0.1:0 and three_sites holding its allocations, and
 * waits until the daemon has every sample of it (the count stops growing past the
 * truth's). */
static int setup(void **state)
{
    struct fixture *fx = calloc(1, sizeof(*fx));
    e2e_daemon_prepare(&fx->d, "http");
    /* --no-running: the three_sites of tests beside this one are not ours. Blocking: every
     * sample counts (exact at -i 1), also when a sanitized daemon reads slowly. */
    const char *args[] = {"-n",
                          "three_sites",
                          "--no-running",
                          "-i",
                          "1",
                          "--block-client",
                          "--block-timeout-us",
                          "10000000",
                          "--continuous-dump",
                          "200",
                          "--http",
                          "127.0.0.1:0",
                          NULL};
    e2e_daemon_launch(&fx->d, args);
    for (int i = 0; i < 500 && !fx->port; i++) {
        char *log = e2e_read_file(fx->d.log);
        const char *u = strstr(log, "serving pprof on http://127.0.0.1:");
        unsigned port;
        char end[3] = "";
        /* The whole line only: a line being written may show part of the port. */
        if (u && sscanf(u, "serving pprof on http://127.0.0.1:%u%2[/\n]", &port, end) == 2 &&
            strcmp(end, "/\n") == 0)
            fx->port = port;
        free(log);
        if (!fx->port)
            e2e_sleep_ms(10);
    }
    assert_true(fx->port > 0);
    snprintf(fx->out, sizeof(fx->out), "%s/prog.out", fx->d.dir);
    char *prog[] = {(char *)e2e_env("THREE_SITES"), "1", "0", "hold", NULL};
    fx->prog = e2e_spawn_client(&fx->d, prog, fx->out);
    long long last = -2;
    for (long t0 = now_ms(); now_ms() - t0 < 30000;) {
        e2e_sleep_ms(50);
        char *out = e2e_read_file(fx->out);
        bool done = strstr(out, "truth alloc_half") != NULL;
        free(out);
        long long n = samples_of(fx->port, fx->prog);
        if (done && n >= 13000 && n == last)
            break;
        last = n;
    }
    assert_true(last >= 13000);
    *state = fx;
    return 0;
}

static int teardown(void **state)
{
    struct fixture *fx = *state;
    kill(fx->prog, SIGKILL);
    e2e_wait_status(fx->prog);
    assert_int_equal(e2e_daemon_stop(&fx->d, SIGINT), 0);
    unlink(fx->out);
    e2e_daemon_remove_files(&fx->d);
    free(fx);
    return 0;
}

static void test_http_answers(void **state)
{
    struct fixture *fx = *state;
    unsigned port = fx->port;
    char req[256];
    int pid = (int)fx->prog;

    snprintf(req, sizeof(req), "GET /debug/pprof/heap?pid=%d HTTP/1.1\r\n\r\n", pid);
    struct answer a = ask(port, req);
    assert_int_equal(a.status, 200);
    assert_true(a.body_len > 100);
    assert_int_equal((unsigned char)a.body[0], 0x1f); /* gzip */
    assert_int_equal((unsigned char)a.body[1], 0x8b);
    free(a.head);
    expect(port, "GET /debug/pprof/allocs?name=three_sites HTTP/1.0\r\n\r\n", 200, NULL);
    snprintf(req, sizeof(req), "HEAD /debug/pprof/heap?pid=%d HTTP/1.1\r\n\r\n", pid);
    a = ask(port, req);
    assert_int_equal(a.status, 200);
    assert_int_equal(a.body_len, 0);
    assert_non_null(strstr(a.head, "Content-Length: "));
    free(a.head);
    snprintf(req, sizeof(req), "%d", pid);
    expect(port, "GET / HTTP/1.1\r\n\r\n", 200, req);
    expect(port, "GET /debug/pprof/ HTTP/1.1\r\n\r\n", 200, "allocs");
    /* The live HTML view: `heapprof html` of the profile now, its sites in the page's data. */
    snprintf(req, sizeof(req), "GET /html?pid=%d HTTP/1.1\r\n\r\n", pid);
    expect(port, req, 200, "<!DOCTYPE html>");
    expect(port, req, 200, "alloc_leaked");
    snprintf(req, sizeof(req), "/html?pid=%d", pid);
    expect(port, "GET / HTTP/1.1\r\n\r\n", 200, req);

    /* Unknown pids and names, bad queries, paths and methods. */
    expect(port, "GET /debug/pprof/heap?pid=1 HTTP/1.1\r\n\r\n", 404, "pid 1 is not profiled");
    expect(port, "GET /debug/pprof/heap?name=nosuchprog HTTP/1.1\r\n\r\n", 404, "no profiled");
    expect(port, "GET /debug/pprof/heap HTTP/1.1\r\n\r\n", 400, "?pid=N");
    expect(port, "GET /debug/pprof/heap?pid=abc HTTP/1.1\r\n\r\n", 400, "not a process id");
    expect(port, "GET /debug/pprof/heap?pid=-3 HTTP/1.1\r\n\r\n", 400, "not a process id");
    expect(port, "GET /debug/pprof/heap?pid=1&name=x HTTP/1.1\r\n\r\n", 400, "not both");
    expect(port, "GET /debug/pprof/heap?pid=%zz HTTP/1.1\r\n\r\n", 400, "malformed");
    expect(port, "GET /debug/pprof/heap?pid=1&seconds=30 HTTP/1.1\r\n\r\n", 400, "delta");
    expect(port, "GET /debug/pprof/goroutine HTTP/1.1\r\n\r\n", 404, "no such page");
    expect(port, "GET /html?pid=1 HTTP/1.1\r\n\r\n", 404, "pid 1 is not profiled");
    expect(port, "POST /debug/pprof/heap?pid=1 HTTP/1.1\r\nContent-Length: 4\r\n\r\nbody", 405,
           "GET and HEAD");
    expect(port, "garbage\r\n\r\n", 400, NULL);
    expect(port, "\x16\x03\x01\x02\x00", 400, NULL);
    expect(port, "GET / HTTP/2.0\r\n\r\n", 505, NULL);
    char *big = malloc(9000);
    memset(big, 'a', 9000);
    memcpy(big, "GET /", 5);
    a = ask_raw(port, big, 9000, 5000);
    assert_int_equal(a.status, 431);
    free(a.head);
    free(big);
}

/* The trace file grows by the daemon's dumps (every 200 ms) in each of @n windows of
 * 1 s (a sanitized daemon is slow). */
static void expect_dumps_go_on(const struct fixture *fx, int n)
{
    struct stat st;
    assert_int_equal(stat(fx->d.trace, &st), 0);
    off_t last = st.st_size;
    for (int i = 0; i < n; i++) {
        e2e_sleep_ms(1000);
        assert_int_equal(stat(fx->d.trace, &st), 0);
        if (st.st_size <= last)
            fail_msg("no dump written in 1 s (window %d)", i);
        last = st.st_size;
    }
}

static void test_http_slow_clients(void **state)
{
    struct fixture *fx = *state;
    enum { N = 100 };
    int fds[N];
    char req[128];
    snprintf(req, sizeof(req), "GET /debug/pprof/heap?pid=%d HTTP/1.1\r\n\r\n", (int)fx->prog);
    static const char index_req[] = "GET / HTTP/1.1\r\n\r\n";
    for (int i = 0; i < N; i++) {
        fds[i] = connect_port(fx->port);
        if (i % 3 == 1) /* half a request, never finished */
            assert_int_equal(send(fds[i], "GET /debug/pp", 13, MSG_NOSIGNAL), 13);
        else if (i % 3 == 2) /* a whole one, its answer never read */
            assert_int_equal(send(fds[i], index_req, strlen(index_req), MSG_NOSIGNAL),
                             (ssize_t)strlen(index_req));
    }
    /* With every slow client still connected: dumps keep coming, and a good request is
     * answered at once (it waits for nothing but its own profile; 5 s for a sanitized
     * daemon). */
    expect_dumps_go_on(fx, 2);
    for (int k = 0; k < 3; k++) {
        long t0 = now_ms();
        struct answer a = ask_raw(fx->port, req, strlen(req), 5000);
        assert_int_equal(a.status, 200);
        free(a.head);
        printf("# a good request among %d slow clients answered in %ld ms\n", N, now_ms() - t0);
    }
    for (int i = 0; i < N; i++)
        close(fds[i]);
    expect_dumps_go_on(fx, 1);
    assert_true(samples_of(fx->port, fx->prog) >= 13000);
}

/* ---- go tool pprof ---- */

/* go on PATH, else NULL. */
static char *find_go(void)
{
    const char *path = getenv("PATH");
    char *copy = strdup(path ? path : "/usr/bin:/bin"), *save = NULL;
    char *found = NULL;
    for (char *d = strtok_r(copy, ":", &save); d && !found; d = strtok_r(NULL, ":", &save)) {
        char p[512];
        snprintf(p, sizeof(p), "%s/go", d);
        if (access(p, X_OK) == 0)
            found = strdup(p);
    }
    free(copy);
    return found;
}

/* The flat value pprof -top -unit=B prints for @fn in @top, -1 when absent. */
static long long flat_bytes(const char *top, const char *fn)
{
    for (const char *l = top; l && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL) {
        const char *eol = strchr(l, '\n');
        size_t n = eol ? (size_t)(eol - l) : strlen(l);
        size_t fl = strlen(fn);
        if (n > fl && memcmp(l + n - fl, fn, fl) == 0 && l[n - fl - 1] == ' ')
            return strtoll(l, NULL, 10);
    }
    return -1;
}

/* `go tool pprof -top -unit=B URL` with a private GOCACHE/HOME; its stdout. */
static char *pprof_top(const char *go, const struct fixture *fx, const char *what)
{
    char url[256], gocache[320], home[320];
    snprintf(url, sizeof(url), "http://127.0.0.1:%u/debug/pprof/%s?pid=%d", fx->port, what,
             (int)fx->prog);
    snprintf(gocache, sizeof(gocache), "GOCACHE=%s/gocache", fx->d.dir);
    snprintf(home, sizeof(home), "HOME=%s", fx->d.dir);
    char *argv[] = {(char *)go, "tool", "pprof", "-top", "-unit=B", url, NULL};
    char tmpdir[320];
    snprintf(tmpdir, sizeof(tmpdir), "PPROF_TMPDIR=%s", fx->d.dir);
    char *env[] = {gocache, home, tmpdir, "GOTOOLCHAIN=local", NULL};
    struct e2e_run r;
    assert_int_equal(e2e_run(argv, env, &r), 0);
    if (r.status != 0)
        fail_msg("go tool pprof: %d\n%s\n%s", r.status, r.out, r.err);
    char *out = r.out;
    r.out = NULL;
    e2e_run_free(&r);
    return out;
}

static void test_http_go_pprof(void **state)
{
    struct fixture *fx = *state;
    char *go = find_go();
    if (!go) {
        printf("# go not found (scripts/install-deps.sh installs golang-go): skipped\n");
        skip();
    }
    char *out = e2e_read_file(fx->out);
    struct e2e_truth truth[E2E_MAX_TRUTH];
    size_t nt = e2e_parse_truth(out, truth, E2E_MAX_TRUTH);
    assert_int_equal(nt, 3);
    char *heap = pprof_top(go, fx, "heap");
    char *allocs = pprof_top(go, fx, "allocs");
    assert_non_null(strstr(heap, "Type: inuse_space"));
    assert_non_null(strstr(allocs, "Type: alloc_space"));
    for (size_t i = 0; i < nt; i++) {
        long long live = (long long)(truth[i].alloc_bytes - truth[i].free_bytes);
        long long h = flat_bytes(heap, truth[i].name), al = flat_bytes(allocs, truth[i].name);
        /* pprof leaves out nodes of no value in -top */
        if ((live ? h != live : h > 0) || al != (long long)truth[i].alloc_bytes)
            fail_msg("%s: inuse %lld (truth %lld), alloc %lld (truth %llu)\n%s\n%s", truth[i].name,
                     h, live, al, (unsigned long long)truth[i].alloc_bytes, heap, allocs);
    }
    free(heap);
    free(allocs);
    free(out);
    free(go);
    /* pprof saved the profiles it fetched (PPROF_TMPDIR); go may have made a cache. */
    char rm[1024];
    snprintf(rm, sizeof(rm), "rm -rf '%s'/pprof.* '%s/gocache' '%s/pprof'", fx->d.dir, fx->d.dir,
             fx->d.dir);
    assert_int_equal(system(rm), 0);
}

int main(int argc, char **argv)
{
    const struct CMUnitTest robust[] = {
        cmocka_unit_test_setup_teardown(test_http_answers, setup, teardown),
        cmocka_unit_test_setup_teardown(test_http_slow_clients, setup, teardown),
    };
    const struct CMUnitTest go[] = {
        cmocka_unit_test_setup_teardown(test_http_go_pprof, setup, teardown),
    };
    if (argc > 1 && strcmp(argv[1], "go") == 0)
        return cmocka_run_group_tests_name("http_go", go, NULL, NULL);
    return cmocka_run_group_tests_name("http", robust, NULL, NULL);
}
