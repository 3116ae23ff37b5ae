/* tests/programs/idle_frees.c: frees that stay in a thread's batch (preload/client.h) for
 * good: the thread that made them goes idle, and the process ends without exit()
 * (tests/e2e/test_accuracy.c, at interval 1).
 *
 *     idle_frees [HOLD_MS [_exit|exit_group]]
 *
 * A thread allocates 8 blocks of 1000 bytes in idle_alloc(), frees them (fewer than a
 * batch holds) and then blocks on a pipe for good; a second thread does the same with 3
 * blocks in exited_alloc() and exits. The main thread waits HOLD_MS (default 1000),
 * prints "truth NAME alloc_bytes alloc_count free_bytes free_count" for both and ends with
 * _exit(0) (the library's _exit records what the batches hold), or with the exit_group
 * system call itself (default; as a process killed: no code of the library's runs), where
 * only the library's own thread (which records what batches hold every round, or when the
 * service asks before a dump) can have recorded those frees.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define IDLE_BLOCKS 8
#define EXITED_BLOCKS 3
#define BLOCK 1000

static int freed_pipe[2], block_pipe[2];

static void *volatile last;

/* Not tail calls: each is a frame of its own in the samples. */
static __attribute__((noinline)) void *idle_alloc(void)
{
    last = malloc(BLOCK);
    return last;
}

static __attribute__((noinline)) void *exited_alloc(void)
{
    last = malloc(BLOCK);
    return last;
}

static void free_all(void *(*alloc)(void), int n)
{
    void *p[IDLE_BLOCKS];
    for (int i = 0; i < n; i++)
        if (!(p[i] = alloc()))
            exit(3);
    for (int i = 0; i < n; i++)
        free(p[i]);
}

static void *idle_thread(void *arg)
{
    (void)arg;
    free_all(idle_alloc, IDLE_BLOCKS);
    char c = 1;
    if (write(freed_pipe[1], &c, 1) != 1)
        exit(4);
    /* Idle for good: nothing ever comes. */
    (void)read(block_pipe[0], &c, 1);
    return NULL;
}

static void *exiting_thread(void *arg)
{
    (void)arg;
    free_all(exited_alloc, EXITED_BLOCKS);
    return NULL;
}

int main(int argc, char **argv)
{
    long hold_ms = argc > 1 ? atol(argv[1]) : 1000;
    if (pipe(freed_pipe) < 0 || pipe(block_pipe) < 0)
        return 2;
    pthread_t idle, exiting;
    if (pthread_create(&idle, NULL, idle_thread, NULL) != 0 ||
        pthread_create(&exiting, NULL, exiting_thread, NULL) != 0)
        return 2;
    char c;
    if (read(freed_pipe[0], &c, 1) != 1 || pthread_join(exiting, NULL) != 0)
        return 2;
    struct timespec ts = {hold_ms / 1000, (hold_ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
    printf("truth idle_alloc %d %d %d %d\n", IDLE_BLOCKS * BLOCK, IDLE_BLOCKS, IDLE_BLOCKS * BLOCK,
           IDLE_BLOCKS);
    printf("truth exited_alloc %d %d %d %d\n", EXITED_BLOCKS * BLOCK, EXITED_BLOCKS,
           EXITED_BLOCKS * BLOCK, EXITED_BLOCKS);
    fflush(stdout);
    if (argc > 2 && strcmp(argv[2], "_exit") == 0)
        _exit(0);
    syscall(SYS_exit_group, 0);
    return 1;
}
