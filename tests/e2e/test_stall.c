/* tests/e2e/test_stall.c: a service that stops for a moment, or for good, while a
 * program allocates and frees fast (issue 26 case 5). A client that waited the block
 * timeout in vain drops samples only until the service caught up, then waits for it
 * again; the frees it could not record never show as unreleased memory; and a service
 * stopped for good never holds the program. The program (tests/programs/stall_churn.c)
 * frees everything it allocates: any unreleased byte of its loops is a phantom leak. */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "tests/e2e/e2e_daemon.h"

/* Allocations after the stall; every one is sampled (-i 1). */
#define N_AFTER 200000
/* Blocks the program keeps: their frees come while the service is stopped, more than the
 * room the ring keeps for frees (1/8 of 1 MiB: about 4000). */
#define WINDOW "20000"

static pid_t g_children[4];

static void track(pid_t pid)
{
    for (size_t i = 0; i < 4; i++)
        if (g_children[i] <= 0) {
            g_children[i] = pid;
            return;
        }
}

static int teardown_children(void **state)
{
    (void)state;
    for (size_t i = 0; i < 4; i++) {
        if (g_children[i] > 0 && waitpid(g_children[i], NULL, WNOHANG) == 0) {
            kill(g_children[i], SIGCONT);
            kill(g_children[i], SIGKILL);
            waitpid(g_children[i], NULL, 0);
        }
        g_children[i] = 0;
    }
    return 0;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* heapprofd profiling every new process exactly, blocking clients 100 ms (the default),
 * with a 1 MiB ring. */
static void launch(struct e2e_daemon *d, const char *tag)
{
    e2e_daemon_prepare(d, tag);
    const char *args[] = {"--all",          "--no-running", "-i", "1",
                          "--block-client", "--shmem-size", "1m", NULL};
    e2e_daemon_launch(d, args);
    track(d->pid);
}

static void touch(const char *path)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
    assert_true(fd >= 0);
    close(fd);
}

/* The service stopped for 200 ms while the program runs: the program goes from phase 1
 * to phase 2 in the stall, freeing the blocks of phase 1 then, more than the ring has
 * room for. Samples after the stall are kept, nothing the program freed is unreleased,
 * and the allocations whose frees were lost show as possibly freed, apart. */
static void test_stall_recovers_without_phantoms(void **state)
{
    (void)state;
    struct e2e_daemon d;
    launch(&d, "stall");
    char go1[300], go2[300], out[300];
    snprintf(go1, sizeof(go1), "%s/go1", d.dir);
    snprintf(go2, sizeof(go2), "%s/go2", d.dir);
    snprintf(out, sizeof(out), "%s/churn.txt", d.dir);
    char *prog[] = {(char *)e2e_env("STALL_CHURN"), go1, go2, "200000", WINDOW, NULL};
    pid_t c = e2e_spawn_client(&d, prog, out);
    track(c);
    e2e_sleep_ms(300);
    assert_int_equal(kill(d.pid, SIGSTOP), 0);
    touch(go1);
    e2e_sleep_ms(200);
    assert_int_equal(kill(d.pid, SIGCONT), 0);
    /* The stall ends once the service has read what waited in the ring (a few thousand
     * records) and the client noticed: well within 100 ms. */
    e2e_sleep_ms(100);
    double t0 = now_s();
    touch(go2);
    assert_int_equal(e2e_wait_status(c), 0);
    double after_s = now_s() - t0;
    e2e_daemon_wait_ended(&d, &c, 1, 20000);
    assert_int_equal(e2e_daemon_stop(&d, SIGINT), 0);

    struct rp_trace *t = NULL;
    assert_int_equal(rp_trace_load(d.trace, &(struct rp_trace_options){0}, &t), 0);
    const struct rp_trace_process *p = e2e_find_process(t, "stall_churn");
    assert_non_null(p);
    struct e2e_sums before, during, after;
    e2e_sum_function(p, "stall_before", &before);
    e2e_sum_function(p, "stall_during", &during);
    e2e_sum_function(p, "stall_after", &after);
    print_message("  after the stall: %llu of %d allocations sampled (%.2f s); before: %llu, "
                  "during: %llu sampled; %llu records dropped, %llu frees lost, possibly freed "
                  "%llu allocations (%llu bytes)\n",
                  (unsigned long long)after.alloc_count, N_AFTER, after_s,
                  (unsigned long long)before.alloc_count, (unsigned long long)during.alloc_count,
                  (unsigned long long)p->losses.records_dropped, (unsigned long long)p->frees_lost,
                  (unsigned long long)p->possibly_freed_count,
                  (unsigned long long)p->possibly_freed_bytes);
    /* The client waits for the service again once it caught up: at least 95% kept. */
    assert_true(after.alloc_count * 100 >= (uint64_t)N_AFTER * 95);
    assert_false(p->client_error);
    /* The stall did happen (samples dropped while the client did not wait). */
    assert_true(p->buffer_overran);
    /* No phantom leak: what the program freed is freed, or possibly freed. */
    assert_int_equal(before.alloc_bytes, before.free_bytes);
    assert_int_equal(during.alloc_bytes, during.free_bytes);
    assert_int_equal(after.alloc_bytes, after.free_bytes);
    /* Lost frees are shown apart, with their count: the allocations live when they were
     * lost, less those whose free came later after all. */
    assert_true(p->frees_lost > 0);
    assert_true(p->possibly_freed_count > 0);
    assert_true(p->possibly_freed_count <= p->frees_lost);
    rp_trace_free(t);
    assert_int_equal(e2e_check_rules(d.trace), 0);
    e2e_daemon_remove_files(&d);
}

/* The service stopped for good: the program waits one block timeout, then runs on at
 * its own pace, and the dump says the client stopped waiting. */
static void test_stall_stopped_service_never_holds(void **state)
{
    (void)state;
    struct e2e_daemon d;
    launch(&d, "stopped");
    char go[300], out[300];
    snprintf(go, sizeof(go), "%s/go", d.dir);
    snprintf(out, sizeof(out), "%s/churn.txt", d.dir);
    char *prog[] = {(char *)e2e_env("STALL_CHURN"), go, go, "2000000", WINDOW, NULL};
    pid_t c = e2e_spawn_client(&d, prog, out);
    track(c);
    e2e_sleep_ms(200);
    assert_int_equal(kill(d.pid, SIGSTOP), 0);
    double t0 = now_s();
    touch(go);
    /* Unprofiled, 2 million allocations take a few tens of milliseconds. */
    int st = -1;
    while (now_s() - t0 < 10.0 && e2e_alive(c))
        e2e_sleep_ms(5);
    double took = now_s() - t0;
    bool done = !e2e_alive(c);
    assert_int_equal(kill(d.pid, SIGCONT), 0);
    if (done)
        st = 0;
    print_message("  2M allocations with the service stopped: %.2f s\n", took);
    assert_true(done);
    assert_int_equal(st, 0);
    assert_true(took < 3.0);
    e2e_daemon_wait_ended(&d, &c, 1, 20000);
    assert_int_equal(e2e_daemon_stop(&d, SIGINT), 0);
    struct rp_trace *t = NULL;
    assert_int_equal(rp_trace_load(d.trace, &(struct rp_trace_options){0}, &t), 0);
    const struct rp_trace_process *p = e2e_find_process(t, "stall_churn");
    assert_non_null(p);
    assert_true(p->client_error);
    assert_true(p->buffer_overran);
    struct e2e_sums after;
    e2e_sum_function(p, "stall_after", &after);
    assert_int_equal(after.alloc_bytes, after.free_bytes);
    rp_trace_free(t);
    e2e_daemon_remove_files(&d);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_stall_recovers_without_phantoms, teardown_children),
        cmocka_unit_test_teardown(test_stall_stopped_service_never_holds, teardown_children),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
