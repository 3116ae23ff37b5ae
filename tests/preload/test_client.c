/* tests/preload/test_client.c: libheapprof.so end to end against a fake service.
 *
 * The test plays the service: it listens on a UNIX socket in a temporary directory,
 * accepts the handshake, hands out a ring made with ring_create() and reads the records,
 * while a small program (tests/preload/alloc_prog.c, semantics_prog.c) runs under
 * LD_PRELOAD. Paths come from the environment set in tests/preload/meson.build:
 * HEAPPROF_TEST_LIB, HEAPPROF_TEST_ALLOC_PROG, HEAPPROF_TEST_SEMANTICS_PROG.
 */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* cmocka.h needs these four first. */
// clang-format off
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
// clang-format on

#include "common/clock.h"
#include "common/fdpass.h"
#include "shmem_ring/ring.h"
#include "shmem_ring/utable.h"
#include "shmem_ring/wire.h"

static const char *lib_path;
static const char *bump_lib;
static const char *dl_lib;
static const char *alloc_prog;
static const char *semantics_prog;

enum serve_mode {
    SERVE_NONE,         /* no service at all */
    SERVE_PROFILE,      /* full handshake, read every record */
    SERVE_NOT_PROFILED, /* answer WIRE_STATUS_NOT_PROFILED */
    SERVE_HANG_UP,      /* handshake, then close the connection at once */
};

struct record {
    uint16_t type;       /* a WIRE_FREES record is listed as WIRE_FREE records, one per address */
    bool batched;        /* a WIRE_FREE record from a WIRE_FREES */
    struct wire_alloc a; /* WIRE_ALLOC */
    struct wire_free f;  /* WIRE_FREE */
    struct wire_heap_name h;    /* WIRE_HEAP_NAME */
    struct wire_maps_changed m; /* WIRE_MAPS_CHANGED */
    size_t payload_len;
};

struct run {
    int status;
    char out[65536];
    size_t out_len;
    char err[8192];
    size_t err_len;
    /* filled by the fake service */
    bool served;
    struct wire_hello hello;
    struct record *recs;
    size_t nrecs, cap;
    struct ring_stats stats;
    /* executable mappings of the program itself, from the maps fd of the handshake */
    uint64_t exe_lo[8], exe_hi[8];
    size_t nexe;
};

struct env_opts {
    bool preload;
    const char *preload_after; /* another library after libheapprof.so, or NULL */
    const char *socket_path;   /* NULL: no HEAPPROF_SOCKET */
    bool startup;
};

static void read_all(int fd, char *buf, size_t cap, size_t *len)
{
    *len = 0;
    for (;;) {
        ssize_t n = read(fd, buf + *len, cap - 1 - *len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            break;
        *len += (size_t)n;
    }
    buf[*len] = 0;
}

static pid_t spawn(const char *prog, const char *arg, const struct env_opts *o, int out_fd,
                   int err_fd)
{
    static char env_preload[4096], env_socket[4096];
    char *envp[12];
    int n = 0;

    if (o->preload) {
        snprintf(env_preload, sizeof(env_preload), "LD_PRELOAD=%s%s%s", lib_path,
                 o->preload_after ? ":" : "", o->preload_after ? o->preload_after : "");
        envp[n++] = env_preload;
    }
    if (o->socket_path) {
        snprintf(env_socket, sizeof(env_socket), "HEAPPROF_SOCKET=%s", o->socket_path);
        envp[n++] = env_socket;
    }
    if (o->startup)
        envp[n++] = "HEAPPROF_STARTUP=1";
    if (o->socket_path || o->startup) {
        envp[n++] = "HEAPPROF_INIT_TIMEOUT_MS=5000";
        envp[n++] = "HEAPPROF_SEED=1";
        /* The hook path must never allocate: abort if it does. */
        envp[n++] = "HEAPPROF_TRAP_REENTRY=1";
    }
    envp[n] = NULL;
    char *argv[3] = {(char *)prog, (char *)arg, NULL};

    pid_t pid = fork();
    if (pid == 0) {
        (void)dup2(out_fd, 1);
        (void)dup2(err_fd, 2);
        execve(prog, argv, envp);
        _exit(127);
    }
    return pid;
}

static void add_record(struct run *run, const struct record *r)
{
    if (run->nrecs == run->cap) {
        run->cap = run->cap ? run->cap * 2 : 256;
        run->recs = realloc(run->recs, run->cap * sizeof(*run->recs));
        assert_non_null(run->recs);
    }
    run->recs[run->nrecs++] = *r;
}

static void drain(ring_t *r, struct run *run)
{
    struct ring_rspan rs;
    int ret;
    while ((ret = ring_begin_read(r, &rs)) == 0) {
        struct record rec = {.type = rs.type, .payload_len = rs.len};
        if (rs.type == WIRE_ALLOC) {
            assert_true(rs.len >= sizeof(rec.a));
            memcpy(&rec.a, rs.data, sizeof(rec.a));
        } else if (rs.type == WIRE_HEAP_NAME) {
            assert_int_equal(wire_decode_heap_name(rs.data, rs.len, &rec.h), 0);
        } else if (rs.type == WIRE_MAPS_CHANGED) {
            assert_int_equal(wire_decode_maps_changed(rs.data, rs.len, &rec.m), 0);
        } else if (rs.type == WIRE_FREES) {
            struct wire_frees fs;
            uint64_t addrs[WIRE_MAX_FREES];
            assert_int_equal(wire_decode_frees(rs.data, rs.len, &fs, addrs), 0);
            rec.type = WIRE_FREE;
            rec.batched = true;
            for (uint32_t i = 0; i < fs.n; i++)
                if (addrs[i]) {
                    rec.f = (struct wire_free){.addr = addrs[i], .heap_id = fs.heap_id};
                    add_record(run, &rec);
                }
            ring_end_read(r, &rs);
            continue;
        } else {
            assert_int_equal(rs.type, WIRE_FREE);
            assert_int_equal(rs.len, sizeof(rec.f));
            memcpy(&rec.f, rs.data, sizeof(rec.f));
        }
        add_record(run, &rec);
        ring_end_read(r, &rs);
    }
    assert_int_equal(ret, -EAGAIN);
}

static void check_proc_fd(int fd, pid_t pid, const char *what)
{
    char link[64], target[256], want[64];
    snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
    ssize_t n = readlink(link, target, sizeof(target) - 1);
    assert_true(n > 0);
    target[n] = 0;
    snprintf(want, sizeof(want), "/proc/%d/%s", (int)pid, what);
    assert_string_equal(target, want);
}

static const char *served_prog;
/* The selection of heaps the fake service sends a client that speaks WIRE_FEATURE_HEAPS
 * (NULL: it does not accept the feature, as an older service). */
static const struct wire_heaps *serve_heaps;
/* The fake service also sends an unwind table (empty: every walk fails, stacks are
 * copied; the client checks the loader's counts before each sample). */
static bool serve_table;
/* The fake service asks for no block mode. */
static bool serve_noblock;
/* The fake service takes frees in batches (WIRE_FEATURE_FREE_BATCH). */
static bool serve_batch;
/* The fake service reads nothing until this file exists. */
static const char *serve_hold_file;

static void read_exe_mappings(int maps_fd, struct run *run)
{
    static char buf[1 << 16];
    ssize_t n = pread(maps_fd, buf, sizeof(buf) - 1, 0);
    assert_true(n > 0);
    buf[n] = 0;
    char *save = NULL;
    for (char *line = strtok_r(buf, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        unsigned long long lo, hi;
        char perms[8];
        const char *path = strchr(line, '/');
        if (!path || !served_prog || strcmp(path, served_prog) != 0)
            continue;
        if (sscanf(line, "%llx-%llx %7s", &lo, &hi, perms) == 3 && perms[2] == 'x' &&
            run->nexe < 8) {
            run->exe_lo[run->nexe] = lo;
            run->exe_hi[run->nexe++] = hi;
        }
    }
}

static bool in_exe(const struct run *run, uint64_t pc)
{
    for (size_t i = 0; i < run->nexe; i++)
        if (pc >= run->exe_lo[i] && pc < run->exe_hi[i])
            return true;
    return false;
}

static void serve(int lsock, pid_t child, enum serve_mode mode, uint64_t interval, struct run *run)
{
    struct pollfd pfd = {.fd = lsock, .events = POLLIN};
    assert_int_equal(poll(&pfd, 1, 10000), 1);
    int s = accept4(lsock, NULL, NULL, SOCK_CLOEXEC);
    assert_true(s >= 0);

    int fds[2] = {-1, -1};
    size_t nfds = 0;
    assert_int_equal(hp_recv_fds(s, &run->hello, sizeof(run->hello), fds, 2, &nfds), 0);
    run->served = true;
    assert_int_equal(run->hello.magic, WIRE_HELLO_MAGIC);
    assert_int_equal(run->hello.pid, child);
    assert_int_equal(run->hello.reason, WIRE_REASON_STARTUP);
    assert_int_equal(nfds, 2);
    check_proc_fd(fds[0], child, "maps");
    check_proc_fd(fds[1], child, "mem");
    read_exe_mappings(fds[0], run);
    (void)close(fds[0]);
    (void)close(fds[1]);

    struct wire_client_config cfg = {
        .magic = WIRE_CONFIG_MAGIC,
        .status = WIRE_STATUS_PROFILE,
        .features = run->hello.features &
                    (WIRE_FEATURE_REGS_X86_64 | (serve_heaps ? WIRE_FEATURE_HEAPS : 0) |
                     (serve_table ? WIRE_FEATURE_UNWIND_TABLE : 0) |
                     (serve_batch ? WIRE_FEATURE_FREE_BATCH : 0)),
        .block_client = mode == SERVE_PROFILE && !serve_noblock,
        .sampling_interval_bytes = interval,
        .max_stack_bytes = 64 << 10,
        .block_client_timeout_us = 2000000,
    };
    if (mode == SERVE_NOT_PROFILED) {
        cfg.status = WIRE_STATUS_NOT_PROFILED;
        assert_int_equal(hp_send_fds(s, &cfg, sizeof(cfg), NULL, 0), 0);
        (void)close(s);
        return;
    }
    int rfd = -1;
    ring_t *r = NULL;
    assert_int_equal(ring_create(8u << 20, &rfd), 0);
    assert_int_equal(ring_map(rfd, RING_ROLE_READER, &r), 0);
    int send[2] = {rfd, -1};
    if (cfg.features & WIRE_FEATURE_UNWIND_TABLE)
        assert_int_equal(utable_create(UTABLE_DEFAULT_SLOTS, &send[1]), 0);
    assert_int_equal(hp_send_fds(s, &cfg, sizeof(cfg), send, send[1] >= 0 ? 2 : 1), 0);
    if (send[1] >= 0)
        (void)close(send[1]);
    if (cfg.features & WIRE_FEATURE_HEAPS)
        assert_int_equal(hp_send_fds(s, serve_heaps, sizeof(*serve_heaps), NULL, 0), 0);
    (void)close(rfd);
    if (mode == SERVE_HANG_UP) {
        (void)close(s);
        r = ring_unmap(r);
        return;
    }

    uint64_t deadline = hp_clock_ns(CLOCK_MONOTONIC) + 30ull * 1000000000u;
    while (serve_hold_file && access(serve_hold_file, F_OK) != 0) {
        struct timespec ts = {0, 5 * 1000 * 1000};
        nanosleep(&ts, NULL);
        assert_true(hp_clock_ns(CLOCK_MONOTONIC) < deadline);
    }
    bool eof = false;
    while (!eof) {
        drain(r, run);
        ring_set_reader_idle(r, true);
        drain(r, run);
        struct pollfd sp = {.fd = s, .events = POLLIN};
        int n = poll(&sp, 1, 200);
        ring_set_reader_idle(r, false);
        if (n == 1) {
            char buf[256];
            ssize_t got = read(s, buf, sizeof(buf));
            if (got == 0 || (got < 0 && errno == ECONNRESET))
                eof = true;
        }
        assert_true(hp_clock_ns(CLOCK_MONOTONIC) < deadline);
    }
    /* The client is gone: everything it reserved is published. */
    drain(r, run);
    ring_get_stats(r, &run->stats);
    r = ring_unmap(r);
    (void)close(s);
}

/* Runs @prog (with @arg) in the environment @o, served per @mode. */
static void run_prog(const char *prog, const char *arg, const struct env_opts *o,
                     enum serve_mode mode, uint64_t interval, int lsock, struct run *run)
{
    int out[2], err[2];

    assert_int_equal(pipe2(out, O_CLOEXEC), 0);
    assert_int_equal(pipe2(err, O_CLOEXEC), 0);
    char real[4096];
    served_prog = realpath(prog, real) ? real : prog;
    pid_t pid = spawn(prog, arg, o, out[1], err[1]);
    assert_true(pid > 0);
    (void)close(out[1]);
    (void)close(err[1]);
    if (mode != SERVE_NONE)
        serve(lsock, pid, mode, interval, run);
    read_all(out[0], run->out, sizeof(run->out), &run->out_len);
    read_all(err[0], run->err, sizeof(run->err), &run->err_len);
    (void)close(out[0]);
    (void)close(err[0]);
    assert_int_equal(waitpid(pid, &run->status, 0), pid);
}

/* ---- fixture: a listening socket in a temporary directory ---------------------- */

struct fixture {
    char dir[64];
    char sock_path[128];
    int lsock;
    struct run *run;
};

static int setup(void **state)
{
    struct fixture *f = calloc(1, sizeof(*f));
    if (!f)
        return -1;
    snprintf(f->dir, sizeof(f->dir), "/tmp/heapprof-test-XXXXXX");
    if (!mkdtemp(f->dir))
        return -1;
    snprintf(f->sock_path, sizeof(f->sock_path), "%s/sock", f->dir);
    f->lsock = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    strcpy(sa.sun_path, f->sock_path);
    if (bind(f->lsock, (struct sockaddr *)&sa, sizeof(sa)) < 0 || listen(f->lsock, 4) < 0)
        return -1;
    f->run = calloc(1, sizeof(*f->run));
    *state = f;
    return f->run ? 0 : -1;
}

static int teardown(void **state)
{
    struct fixture *f = *state;
    (void)close(f->lsock);
    (void)unlink(f->sock_path);
    (void)rmdir(f->dir);
    free(f->run->recs);
    free(f->run);
    free(f);
    return 0;
}

static struct run *fresh_run(struct fixture *f)
{
    free(f->run->recs);
    memset(f->run, 0, sizeof(*f->run));
    return f->run;
}

static bool exited_ok(const struct run *run)
{
    return WIFEXITED(run->status) && WEXITSTATUS(run->status) == 0;
}

/* ---- tests ----------------------------------------------------------------------- */

struct prog_alloc {
    uint64_t addr, size;
};

static void test_client_records_allocations(void **state)
{
    struct fixture *f = *state;
    struct run *run = fresh_run(f);
    struct env_opts o = {.preload = true, .socket_path = f->sock_path, .startup = true};

    run_prog(alloc_prog, "addrs", &o, SERVE_PROFILE, 1, f->lsock, run);
    assert_true(exited_ok(run));
    assert_int_equal(run->err_len, 0);
    assert_true(run->served);
    assert_int_equal(run->stats.records_dropped, 0);
    assert_true(run->nexe > 0);

    /* What the program says it did. */
    struct prog_alloc allocs[256];
    uint64_t frees[256];
    size_t na = 0, nf = 0;
    unsigned long long sum_allocs = 0, sum_bytes = 0, sum_frees = 0;
    char *save = NULL;
    for (char *line = strtok_r(run->out, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        unsigned long long a, s;
        if (sscanf(line, "A %llx %llu", &a, &s) == 2) {
            assert_true(na < 256);
            allocs[na++] = (struct prog_alloc){a, s};
        } else if (sscanf(line, "F %llx", &a) == 1) {
            assert_true(nf < 256);
            frees[nf++] = a;
        } else {
            assert_int_equal(sscanf(line, "allocs=%llu bytes=%llu frees=%llu", &sum_allocs,
                                    &sum_bytes, &sum_frees),
                             3);
        }
    }
    assert_int_equal(na, sum_allocs);
    assert_int_equal(nf, sum_frees);
    assert_int_equal(na, 109);
    assert_int_equal(nf, 59);

    /* The records carry no sequence number of the client's (the service numbers them
     * in ring order): replay them in that order, which must be causal. */
    for (size_t i = 0; i < run->nrecs; i++) {
        if (run->recs[i].type == WIRE_ALLOC)
            assert_int_equal(run->recs[i].a.unused0, 0);
        else
            assert_int_equal(run->recs[i].f.unused0, 0);
    }

    uint64_t sample_sum = 0;
    size_t live_cap = run->nrecs + 1, nlive = 0, freed_sampled = 0;
    uint64_t *live = calloc(live_cap, sizeof(uint64_t));
    uint64_t *freed = calloc(live_cap, sizeof(uint64_t));
    for (size_t r = 0; r < run->nrecs; r++) {
        const struct record *rec = &run->recs[r];
        if (rec->type == WIRE_ALLOC) {
            const struct wire_alloc *a = &rec->a;
            sample_sum += a->sample_size;
            assert_int_equal(a->sample_size, a->size); /* interval 1: exact */
            assert_true(a->stack_len > 0);
            assert_int_equal(rec->payload_len, sizeof(*a) + a->stack_len);
            assert_true(a->stack_len <= 64 << 10);
            assert_int_not_equal(a->regs[WIRE_REG_RIP], 0);
            assert_int_equal(a->stack_ptr, a->regs[WIRE_REG_RSP]);
            /* The stack starts in the program's own frame: no libheapprof.so frame. */
            assert_true(in_exe(run, a->regs[WIRE_REG_RIP]));
            assert_int_equal(a->tid, run->hello.pid);
            assert_int_equal(a->flags & WIRE_ALLOC_UNKNOWN_STACK, 0);
            assert_int_equal(a->heap_id, 0);
            live[nlive++] = a->addr;
        } else {
            /* A free follows an allocation of the same address that is still live. */
            bool found = false;
            for (size_t i = 0; i < nlive && !found; i++) {
                if (live[i] == rec->f.addr) {
                    live[i] = live[--nlive];
                    found = true;
                }
            }
            assert_true(found);
            freed[freed_sampled++] = rec->f.addr;
        }
    }
    printf("# %zu records, %llu bytes attributed, max fill %llu\n", run->nrecs,
           (unsigned long long)sample_sum, (unsigned long long)run->stats.max_fill_bytes);
    /* Exactly the program's allocations, and every one of its frees. */
    assert_int_equal(sample_sum, sum_bytes);
    for (size_t i = 0; i < na; i++) {
        bool found = false;
        for (size_t j = 0; j < run->nrecs && !found; j++)
            found = run->recs[j].type == WIRE_ALLOC && run->recs[j].a.addr == allocs[i].addr &&
                    run->recs[j].a.size == allocs[i].size;
        assert_true(found);
    }
    assert_int_equal(freed_sampled, nf);
    for (size_t i = 0; i < nf; i++) {
        bool found = false;
        for (size_t j = 0; j < freed_sampled && !found; j++)
            found = freed[j] == frees[i];
        assert_true(found);
    }
    free(live);
    free(freed);
}

/* The bug: free_sized and free_aligned_sized (C23, glibc 2.39) were not exported, so a
 * sampled block freed with them stayed live in the profile. They are recorded like free()
 * and reach the allocator (glibc 2.36 has neither: our own forward to free()). */
static void test_client_bug_sized_frees_unrecorded(void **state)
{
    struct fixture *f = *state;
    struct run *run = fresh_run(f);
    struct env_opts o = {.preload = true, .socket_path = f->sock_path, .startup = true};

    run_prog(alloc_prog, "sized", &o, SERVE_PROFILE, 1, f->lsock, run);
    assert_true(exited_ok(run));
    unsigned long long a[2], fr[2], size;
    size_t na = 0, nf = 0;
    char *save = NULL;
    for (char *line = strtok_r(run->out, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        if (na < 2 && sscanf(line, "A %llx %llu", &a[na], &size) == 2)
            na++;
        else if (nf < 2 && sscanf(line, "F %llx", &fr[nf]) == 1)
            nf++;
    }
    assert_int_equal(na, 2);
    assert_int_equal(nf, 2);
    for (size_t i = 0; i < 2; i++) {
        bool alloc_seen = false, free_seen = false;
        for (size_t j = 0; j < run->nrecs; j++) {
            alloc_seen |= run->recs[j].type == WIRE_ALLOC && run->recs[j].a.addr == a[i];
            free_seen |= run->recs[j].type == WIRE_FREE && run->recs[j].f.addr == fr[i];
        }
        assert_true(alloc_seen);
        assert_true(free_seen);
    }
}

/* The heap API against a service that selects arena.a and arena.c (registered during the
 * session), not arena.b nor malloc: exactly the selected heaps' reports are recorded, at
 * interval 1 every one, with their heap ids, sizes and weights; frees of sampled blocks
 * are recorded on their heap; each heap's name comes once. */
static void test_client_heaps(void **state)
{
    struct fixture *f = *state;
    struct run *run = fresh_run(f);
    struct env_opts o = {.preload = true, .socket_path = f->sock_path, .startup = true};
    struct wire_heaps sel = {.n = 2};
    strcpy(sel.names[0], "arena.a");
    strcpy(sel.names[1], "arena.c");
    serve_heaps = &sel;
    run_prog(alloc_prog, "heaps", &o, SERVE_PROFILE, 1, f->lsock, run);
    serve_heaps = NULL;
    print_message("  %s%s", run->out, run->err);
    assert_true(exited_ok(run));
    assert_non_null(strstr(run->out, "heaps=1,2,3 sampled=58\n"));
    unsigned allocs[4] = {0}, frees[4] = {0}, names[4] = {0};
    for (size_t i = 0; i < run->nrecs; i++) {
        const struct record *r = &run->recs[i];
        if (r->type == WIRE_HEAP_NAME) {
            assert_true(r->h.heap_id <= 3);
            names[r->h.heap_id]++;
            const char *want[] = {"", "arena.a", "arena.b", "arena.c"};
            assert_string_equal(r->h.name, want[r->h.heap_id]);
        } else if (r->type == WIRE_ALLOC) {
            uint32_t h = r->a.heap_id;
            assert_true(h == 1 || h == 3); /* not arena.b, not malloc */
            allocs[h]++;
            if (r->a.addr == 0x200000) {
                assert_int_equal(r->a.size, 100);
                assert_int_equal(r->a.sample_size, 777);
            } else {
                uint64_t base = h == 1 ? 0x100000 : 0x400000, size = h == 1 ? 32 : 16;
                assert_int_equal((r->a.addr - base) % size, 0);
                assert_int_equal(r->a.size, size);
                assert_int_equal(r->a.sample_size, size);
            }
        } else if (r->type == WIRE_FREE) {
            assert_int_equal(r->f.heap_id, 1);
            assert_true(r->f.addr >= 0x100000 && r->f.addr < 0x100000 + 32 * 10);
            frees[1]++;
        }
    }
    assert_int_equal(allocs[1], 51);
    assert_int_equal(allocs[3], 7);
    assert_int_equal(frees[1], 10);
    assert_int_equal(names[1], 1);
    assert_int_equal(names[2], 1);
    assert_int_equal(names[3], 1);
}

/* The bug: a free() from a signal handler that interrupted one of our hooks (here the
 * sampled path of malloc, at interval 1) took the address out of the sampled set and then
 * recorded nothing, silently: the block stayed live in the profile. Now each such free is
 * recorded (never waiting) or, when the ring has no room, counted as lost. The program
 * runs on an allocator that is safe in a signal handler (bump_alloc.c, preloaded after
 * us: the hooks forward to it). */
/* alloc_prog sigfree, its frees recorded one by one or in batches (@batches). */
static void run_signal_frees(struct fixture *f, bool batches)
{
    struct run *run = fresh_run(f);
    struct env_opts o = {
        .preload = true, .preload_after = bump_lib, .socket_path = f->sock_path, .startup = true};

    serve_batch = batches;
    run_prog(alloc_prog, "sigfree", &o, SERVE_PROFILE, 1, f->lsock, run);
    serve_batch = false;
    assert_true(exited_ok(run));
    const char *sig = strstr(run->out, "signals=");
    assert_non_null(sig);
    unsigned long long freed = strtoull(sig + 8, NULL, 10);
    assert_int_equal(freed, 500);
    size_t missing = 0, listed = 0;
    char *save = NULL;
    for (char *line = strtok_r(run->out, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        unsigned long long a;
        if (sscanf(line, "F %llx", &a) != 1)
            continue;
        listed++;
        bool seen = false;
        for (size_t j = 0; j < run->nrecs && !seen; j++)
            seen = run->recs[j].type == WIRE_FREE && run->recs[j].f.addr == a;
        missing += !seen;
    }
    print_message("    %zu frees from the handler%s, %zu not recorded, %llu counted as lost\n",
                  listed, batches ? " (in batches)" : "", missing,
                  (unsigned long long)run->stats.frees_lost);
    assert_int_equal(listed, freed);
    assert_true(missing <= run->stats.frees_lost);
}

static void test_client_bug_signal_free_lost(void **state)
{
    run_signal_frees(*state, false);
}

/* The same with frees in batches: a handler that interrupts the thread's own use of its
 * batch records its free at once; one that does not adds it to the batch. */
static void test_client_signal_frees_batched(void **state)
{
    run_signal_frees(*state, true);
}

static void test_client_passthrough_when_service_missing(void **state)
{
    struct fixture *f = *state;
    struct run *run = fresh_run(f);
    char missing[160];
    struct env_opts plain = {0};

    run_prog(alloc_prog, NULL, &plain, SERVE_NONE, 0, -1, run);
    assert_true(exited_ok(run));
    char expected[256];
    assert_true(run->out_len < sizeof(expected));
    memcpy(expected, run->out, run->out_len + 1);
    assert_string_equal(expected, "allocs=109 bytes=119981 frees=59\n");

    snprintf(missing, sizeof(missing), "%s/missing", f->dir);
    struct env_opts o = {.preload = true, .socket_path = missing, .startup = true};
    run = fresh_run(f);
    run_prog(alloc_prog, NULL, &o, SERVE_NONE, 0, -1, run);
    assert_true(exited_ok(run));
    assert_string_equal(run->out, expected);
    /* Exactly one line on stderr, naming the socket. */
    assert_true(run->err_len > 0);
    assert_int_equal(run->err[run->err_len - 1], '\n');
    assert_null(memchr(run->err, '\n', run->err_len - 1));
    assert_non_null(strstr(run->err, "heapprof: cannot reach the profiling service at "));
    assert_non_null(strstr(run->err, missing));
    assert_non_null(strstr(run->err, "running unprofiled"));

    /* No HEAPPROF_* variable at all: silent. */
    struct env_opts dormant = {.preload = true};
    run = fresh_run(f);
    run_prog(alloc_prog, NULL, &dormant, SERVE_NONE, 0, -1, run);
    assert_true(exited_ok(run));
    assert_string_equal(run->out, expected);
    assert_int_equal(run->err_len, 0);
}

static void test_client_not_profiled_answer(void **state)
{
    struct fixture *f = *state;
    struct run *run = fresh_run(f);
    struct env_opts o = {.preload = true, .socket_path = f->sock_path, .startup = true};

    run_prog(alloc_prog, NULL, &o, SERVE_NOT_PROFILED, 1, f->lsock, run);
    assert_true(exited_ok(run));
    assert_true(run->served);
    assert_string_equal(run->out, "allocs=109 bytes=119981 frees=59\n");
    assert_int_equal(run->err_len, 0);
}

static void test_client_service_hangs_up(void **state)
{
    struct fixture *f = *state;
    struct run *run = fresh_run(f);
    struct env_opts o = {.preload = true, .socket_path = f->sock_path, .startup = true};

    /* The service closes the connection right after the handshake and nobody reads the
     * ring: the client must notice, go passthrough and let the program finish. */
    uint64_t t0 = hp_clock_ns(CLOCK_MONOTONIC);
    run_prog(alloc_prog, "many", &o, SERVE_HANG_UP, 1, f->lsock, run);
    uint64_t took_ms = (hp_clock_ns(CLOCK_MONOTONIC) - t0) / 1000000;
    assert_true(exited_ok(run));
    assert_int_equal(run->err_len, 0);
    assert_non_null(strstr(run->out, "allocs=20109 "));
    assert_true(took_ms < 10000);
}

static void check_threads_run(struct run *run, uint64_t interval)
{
    assert_true(exited_ok(run));
    assert_string_equal(run->out, "threads done\n");
    assert_int_equal(run->err_len, 0);
    assert_int_equal(run->stats.records_dropped, 0);

    uint32_t tids[16];
    size_t ntids = 0;
    uint64_t n64 = 0, est64 = 0, frees = 0, stack_bytes = 0;
    for (size_t i = 0; i < run->nrecs; i++) {
        const struct record *rec = &run->recs[i];
        if (rec->type == WIRE_FREE) {
            frees++;
            continue;
        }
        const struct wire_alloc *a = &rec->a;
        assert_true(a->stack_len > 0);
        assert_int_equal(a->flags & WIRE_ALLOC_UNKNOWN_STACK, 0);
        assert_int_not_equal(a->regs[WIRE_REG_RIP], 0);
        assert_int_equal(a->sample_size % interval, 0);
        if (a->size != 64)
            continue;
        n64++;
        est64 += a->sample_size;
        stack_bytes += a->stack_len;
        bool seen = false;
        for (size_t j = 0; j < ntids; j++)
            seen = seen || tids[j] == a->tid;
        if (!seen) {
            assert_true(ntids < 16);
            tids[ntids++] = a->tid;
        }
    }
    const double total = 4.0 * 20000 * 64;
    printf("# interval %llu: %llu samples of malloc(64), estimate %llu of %.0f, %zu threads, "
           "%llu frees, mean stack copy %llu bytes\n",
           (unsigned long long)interval, (unsigned long long)n64, (unsigned long long)est64, total,
           ntids, (unsigned long long)frees, (unsigned long long)(n64 ? stack_bytes / n64 : 0));
    assert_true(ntids >= 2);
    if (interval == 1) {
        assert_int_equal(n64, 4 * 20000);
        assert_int_equal(ntids, 4);
        assert_true(frees >= n64);
    } else {
        /* Poisson: sd = sqrt(total * interval) = 2.8% of the total; allow 5 sd. */
        assert_true(fabs((double)est64 - total) < 5 * sqrt(total * (double)interval));
    }
}

static void test_client_threads(void **state)
{
    struct fixture *f = *state;
    struct env_opts o = {.preload = true, .socket_path = f->sock_path, .startup = true};

    struct run *run = fresh_run(f);
    run_prog(alloc_prog, "threads", &o, SERVE_PROFILE, 1, f->lsock, run);
    check_threads_run(run, 1);

    run = fresh_run(f);
    run_prog(alloc_prog, "threads", &o, SERVE_PROFILE, 4096, f->lsock, run);
    check_threads_run(run, 4096);
}

/* Frees in batches (WIRE_FEATURE_FREE_BATCH), at interval 1, 4 threads each reusing its
 * last freed address at once: in ring order every address is allocated, then freed, then
 * allocated again, a sampled allocation that took the free of its address over carrying
 * that free first; no free of an address not live, no allocation of one live; every
 * block freed by the end. */
/* Replaying a run's records per address: an open-addressing table of every address seen
 * (runs reuse few), whether it is live and the size it was allocated with. */
enum { REPLAY_SLOTS = 1 << 16 };
struct replay_slot {
    uint64_t addr, size;
    bool live;
};
static struct replay_slot replay[REPLAY_SLOTS];
static size_t replay_used;

static void replay_reset(void)
{
    memset(replay, 0, sizeof(replay));
    replay_used = 0;
}

/* The slot of the address @rec (a WIRE_ALLOC or WIRE_FREE) is about. */
static struct replay_slot *replay_slot(const struct record *rec)
{
    uint64_t addr = rec->type == WIRE_ALLOC ? rec->a.addr : rec->f.addr;
    size_t k = (size_t)((addr >> 4) * 0x9e3779b97f4a7c15ull >> 48) % REPLAY_SLOTS;
    while (replay[k].addr != 0 && replay[k].addr != addr)
        k = (k + 1) % REPLAY_SLOTS;
    if (replay[k].addr == 0) {
        assert_true(++replay_used < REPLAY_SLOTS / 2);
        replay[k].addr = addr;
    }
    return &replay[k];
}

static void test_client_batched_frees_keep_order(void **state)
{
    struct fixture *f = *state;
    struct env_opts o = {.preload = true, .socket_path = f->sock_path, .startup = true};
    struct run *run = fresh_run(f);
    serve_batch = true;
    run_prog(alloc_prog, "threads", &o, SERVE_PROFILE, 1, f->lsock, run);
    serve_batch = false;
    assert_true(exited_ok(run));
    assert_int_equal(run->stats.records_dropped, 0);
    assert_int_equal(run->stats.frees_lost, 0);

    replay_reset();
    uint64_t batched = 0, taken = 0, allocs64 = 0;
    for (size_t i = 0; i < run->nrecs; i++) {
        const struct record *rec = &run->recs[i];
        if (rec->type != WIRE_ALLOC && rec->type != WIRE_FREE)
            continue;
        struct replay_slot *seen = replay_slot(rec);
        if (rec->type == WIRE_FREE) {
            assert_true(seen->live);
            seen->live = false;
            batched += rec->batched;
            continue;
        }
        if (rec->a.head_flags & WIRE_HEAD_FREE_FIRST) {
            assert_true(seen->live);
            taken++;
        } else {
            assert_false(seen->live);
        }
        seen->live = true;
        allocs64 += rec->a.size == 64;
    }
    printf("# %zu records: %llu allocations of 64 bytes, %llu frees in batches, %llu taken over "
           "by an allocation of their address\n",
           run->nrecs, (unsigned long long)allocs64, (unsigned long long)batched,
           (unsigned long long)taken);
    assert_int_equal(allocs64, 4 * 20000);
    assert_true(batched > 0);
    assert_true(taken > 0);
}

/* The frees of the blocks of @size in @run: recorded alone (a WIRE_FREE of their own),
 * in a batch (WIRE_FREES) or carried by the next allocation of their address
 * (WIRE_HEAD_FREE_FIRST). Replays the records, which free only live addresses. */
struct free_ways {
    uint64_t alone, batched, carried;
};

static struct free_ways frees_of_size(const struct run *run, uint64_t size)
{
    replay_reset();
    struct free_ways w = {0};
    for (size_t i = 0; i < run->nrecs; i++) {
        const struct record *rec = &run->recs[i];
        if (rec->type != WIRE_ALLOC && rec->type != WIRE_FREE)
            continue;
        struct replay_slot *live = replay_slot(rec);
        bool ours = live->live && live->size == size;
        if (rec->type == WIRE_FREE) {
            if (ours && rec->batched)
                w.batched++;
            else if (ours)
                w.alone++;
            live->live = false;
            continue;
        }
        if ((rec->a.head_flags & WIRE_HEAD_FREE_FIRST) && ours)
            w.carried++;
        live->live = true;
        live->size = rec->a.size;
    }
    return w;
}

/* Regression: a thread that found every batch of frees taken recorded its frees one by
 * one for good, also once the batches of threads that had gone were taken back (a server
 * with more threads than CLIENT_FREEBUFS, or one that made them come and go). */
static void test_client_bug_batches_not_taken_again(void **state)
{
    struct fixture *f = *state;
    struct env_opts o = {.preload = true, .socket_path = f->sock_path, .startup = true};
    struct run *run = fresh_run(f);
    serve_batch = true;
    run_prog(alloc_prog, "manythreads", &o, SERVE_PROFILE, 1, f->lsock, run);
    serve_batch = false;
    assert_true(exited_ok(run));
    assert_string_equal(run->out, "manythreads done\n");
    assert_int_equal(run->stats.records_dropped, 0);
    struct free_ways before = frees_of_size(run, 72), after = frees_of_size(run, 88);
    printf("# frees while every batch was taken: %llu alone, %llu batched, %llu carried; after "
           "the holders went: %llu alone, %llu batched, %llu carried\n",
           (unsigned long long)before.alone, (unsigned long long)before.batched,
           (unsigned long long)before.carried, (unsigned long long)after.alone,
           (unsigned long long)after.batched, (unsigned long long)after.carried);
    /* The late thread had no batch: every free alone. */
    assert_int_equal(before.alone, 50);
    /* It took one once there was one again; every free recorded. */
    assert_int_equal(after.alone, 0);
    assert_int_equal(after.batched + after.carried, 50);
}

static void test_client_glibc_semantics_kept(void **state)
{
    struct fixture *f = *state;
    char reference[sizeof(f->run->out)];

    struct env_opts plain = {0};
    struct run *run = fresh_run(f);
    run_prog(semantics_prog, NULL, &plain, SERVE_NONE, 0, -1, run);
    assert_true(exited_ok(run));
    memcpy(reference, run->out, run->out_len + 1);
    assert_null(strstr(reference, "FAIL"));

    /* Preloaded but dormant. */
    struct env_opts dormant = {.preload = true};
    run = fresh_run(f);
    run_prog(semantics_prog, NULL, &dormant, SERVE_NONE, 0, -1, run);
    assert_true(exited_ok(run));
    assert_string_equal(run->out, reference);
    assert_int_equal(run->err_len, 0);

    /* Preloaded and profiling every allocation. */
    struct env_opts o = {.preload = true, .socket_path = f->sock_path, .startup = true};
    run = fresh_run(f);
    run_prog(semantics_prog, NULL, &o, SERVE_PROFILE, 1, f->lsock, run);
    assert_true(exited_ok(run));
    assert_string_equal(run->out, reference);
    assert_int_equal(run->err_len, 0);
    assert_true(run->nrecs > 10);
}

/* A record that tells the service of code loaded (WIRE_MAPS_CHANGED) found the ring full:
 * the next sample tells it, before its own record. The service rereads the maps when
 * told, not for their age: a lost record left it naming the new code with the old maps
 * (and, after an unload, the client never walking again). The program (run_dlfull() in
 * alloc_prog.c) fills the ring to the last byte while the service reads nothing, frees a
 * block (its record, in the room frees keep, marks the place), loads a library and
 * samples, lets the service read, and samples once more: after the mark come the change,
 * then that sample. */
static void test_client_bug_lost_code_change_told_later(void **state)
{
    struct fixture *f = *state;
    struct run *run = fresh_run(f);
    char hold[160], arg[4096];
    snprintf(hold, sizeof(hold), "%s/hold", f->dir);
    snprintf(arg, sizeof(arg), "dlfull:%s:%s", dl_lib, hold);
    struct env_opts o = {.preload = true, .socket_path = f->sock_path, .startup = true};
    serve_table = true;
    serve_noblock = true;
    serve_hold_file = hold;
    run_prog(alloc_prog, arg, &o, SERVE_PROFILE, 1, f->lsock, run);
    serve_table = false;
    serve_noblock = false;
    serve_hold_file = NULL;
    (void)unlink(hold);
    print_message("  status %d, %zu records, %llu dropped, out: %s", run->status, run->nrecs,
                  (unsigned long long)run->stats.records_dropped, run->out);
    assert_true(exited_ok(run));
    unsigned long long mark = 0;
    assert_int_equal(sscanf(run->out, "dlfull mark=%llx", &mark), 1);
    assert_true(run->stats.records_dropped > 0); /* the ring did fill up */
    size_t at = run->nrecs;
    for (size_t i = 0; i < run->nrecs; i++)
        if (run->recs[i].type == WIRE_FREE && run->recs[i].f.addr == mark)
            at = i;
    assert_true(at < run->nrecs);
    for (size_t i = at; i < run->nrecs; i++)
        print_message("  record %zu after the mark: type %u\n", i - at, run->recs[i].type);
    assert_int_equal(run->nrecs, at + 3);
    assert_int_equal(run->recs[at + 1].type, WIRE_MAPS_CHANGED);
    assert_int_not_equal(run->recs[at + 1].m.ask, 0); /* loaded code: a reread is asked for */
    assert_int_equal(run->recs[at + 2].type, WIRE_ALLOC);
}

int main(void)
{
    lib_path = getenv("HEAPPROF_TEST_LIB");
    alloc_prog = getenv("HEAPPROF_TEST_ALLOC_PROG");
    semantics_prog = getenv("HEAPPROF_TEST_SEMANTICS_PROG");
    bump_lib = getenv("HEAPPROF_TEST_BUMP_LIB");
    dl_lib = getenv("HEAPPROF_TEST_DL_LIB");
    if (!lib_path || !alloc_prog || !semantics_prog || !bump_lib || !dl_lib) {
        fprintf(stderr,
                "HEAPPROF_TEST_LIB, HEAPPROF_TEST_ALLOC_PROG, HEAPPROF_TEST_SEMANTICS_PROG, "
                "HEAPPROF_TEST_BUMP_LIB and HEAPPROF_TEST_DL_LIB must be set\n");
        return 1;
    }
    signal(SIGPIPE, SIG_IGN);

    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_client_records_allocations, setup, teardown),
        cmocka_unit_test_setup_teardown(test_client_heaps, setup, teardown),
        cmocka_unit_test_setup_teardown(test_client_passthrough_when_service_missing, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_client_not_profiled_answer, setup, teardown),
        cmocka_unit_test_setup_teardown(test_client_service_hangs_up, setup, teardown),
        cmocka_unit_test_setup_teardown(test_client_glibc_semantics_kept, setup, teardown),
        cmocka_unit_test_setup_teardown(test_client_threads, setup, teardown),
        cmocka_unit_test_setup_teardown(test_client_batched_frees_keep_order, setup, teardown),
        cmocka_unit_test_setup_teardown(test_client_bug_sized_frees_unrecorded, setup, teardown),
        cmocka_unit_test_setup_teardown(test_client_bug_signal_free_lost, setup, teardown),
        cmocka_unit_test_setup_teardown(test_client_signal_frees_batched, setup, teardown),
        cmocka_unit_test_setup_teardown(test_client_bug_batches_not_taken_again, setup, teardown),
        cmocka_unit_test_setup_teardown(test_client_bug_lost_code_change_told_later, setup,
                                        teardown),
    };
    return cmocka_run_group_tests_name("client", tests, NULL, NULL);
}
