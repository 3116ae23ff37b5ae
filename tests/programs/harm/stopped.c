/* tests/programs/harm/stopped.c: a program stopped in the middle of its run, as by a
 * debugger's breakpoint or Ctrl-Z, for longer than the service's stall timeout (2 s).
 *
 *   stopped ptrace|sigstop
 *
 * The main thread allocates 8 KiB blocks below a 60 KiB frame: under `heapprof record
 * --no-fast-unwind` each is sampled (at least the interval) with 64 KiB of stack copied,
 * so the thread spends much of its time between reserving a record and publishing it
 * (few frames: the service unwinds them fast and keeps up). A child
 * plays the debugger: it stops the main thread with ptrace until it finds it inside the
 * library's stack copy (a `rep movsb` in libheapprof.so's code), then keeps it stopped for
 * HOLD_MS, either in the ptrace stop ("ptrace", state t) or, after detaching with SIGSTOP,
 * in a group stop ("sigstop", state T) ended by SIGCONT. Where the library does not copy
 * stacks (unprofiled, dormant) the child gives up after SEARCH_MS and nothing is held.
 * Then the program allocates in after_stop(): a profile that goes on has those.
 *
 * Prints "done"; the child tells on stderr whether it held the thread inside a record
 * ("held inside a record") or could not trace ("cannot trace").
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/ptrace.h>
#include <sys/user.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define SEARCH_MS 10000
#define HOLD_MS 3500

static int done_pipe[2];

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static void sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000};
    while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
        ;
}

/* The executable range of libheapprof.so in @pid, from its maps, when it is recording
 * (it maps a ring). */
static int find_lib(pid_t pid, uintptr_t *lo, uintptr_t *hi)
{
    char path[64], line[512];
    snprintf(path, sizeof(path), "/proc/%d/maps", (int)pid);
    FILE *f = fopen(path, "re");
    if (!f)
        return -1;
    bool lib = false, ring = false;
    while (fgets(line, sizeof(line), f)) {
        unsigned long a, b;
        char perms[8];
        if (sscanf(line, "%lx-%lx %7s", &a, &b, perms) == 3 && perms[2] == 'x' &&
            strstr(line, "/libheapprof.so")) {
            *lo = a;
            *hi = b;
            lib = true;
        }
        ring |= strstr(line, "heapprof-ring") != NULL;
    }
    fclose(f);
    return lib && ring ? 0 : -1;
}

/* The debugger. Returns its exit status: 0 held inside a record, 1 never found it, 2
 * cannot trace. */
static int debugger(pid_t tid, bool sigstop)
{
    uintptr_t lo = 0, hi = 0;
    uint64_t end = now_ms() + SEARCH_MS;
    sleep_ms(100);
    if (find_lib(tid, &lo, &hi) < 0)
        return 1;
    if (ptrace(PTRACE_SEIZE, tid, 0, 0) < 0)
        return 2;
    while (now_ms() < end) {
        int st;
        if (ptrace(PTRACE_INTERRUPT, tid, 0, 0) < 0 || waitpid(tid, &st, __WALL) != tid)
            return 2;
        struct user_regs_struct regs;
        if (ptrace(PTRACE_GETREGS, tid, 0, &regs) < 0)
            return 2;
        errno = 0;
        long insn = ptrace(PTRACE_PEEKTEXT, tid, (void *)regs.rip, 0);
        bool inside = errno == 0 && regs.rip >= lo && regs.rip < hi &&
                      (insn & 0xffff) == 0xa4f3; /* rep movsb: the stack copy */
        if (inside) {
            fprintf(stderr, "stopped: held inside a record\n");
            if (!sigstop) {
                sleep_ms(HOLD_MS);
                (void)ptrace(PTRACE_DETACH, tid, 0, 0);
            } else {
                /* SIGSTOP waits, pending, until the thread leaves the ptrace stop: it
                 * then stops again at once, where it is, in a group stop. */
                (void)kill(tid, SIGSTOP);
                (void)ptrace(PTRACE_DETACH, tid, 0, 0);
                sleep_ms(HOLD_MS);
                (void)kill(tid, SIGCONT);
            }
            return 0;
        }
        if (ptrace(PTRACE_CONT, tid, 0, 0) < 0)
            return 2;
        sleep_ms(1 + (int)(now_ms() % 7));
    }
    (void)ptrace(PTRACE_INTERRUPT, tid, 0, 0);
    int st;
    (void)waitpid(tid, &st, __WALL);
    (void)ptrace(PTRACE_DETACH, tid, 0, 0);
    return 1;
}

static volatile int sink;

static __attribute__((noinline)) void allocate_below(void)
{
    char *volatile p = malloc(8192);
    if (!p)
        exit(3);
    p[0] = 1;
    free(p);
}

static __attribute__((noinline)) void big_frame(void)
{
    volatile char pad[60 << 10];
    pad[0] = 1;
    pad[sizeof(pad) - 1] = 1;
    allocate_below();
    sink += pad[0];
}

static __attribute__((noinline)) void after_stop(void)
{
    for (int i = 0; i < 64; i++) {
        char *volatile p = malloc(8192);
        if (!p)
            exit(3);
        p[0] = 2;
        free(p);
    }
}

int main(int argc, char **argv)
{
    bool sigstop = argc > 1 && !strcmp(argv[1], "sigstop");
    /* Where Yama restricts ptrace, let our child trace us. */
    (void)prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0);
    if (pipe2(done_pipe, O_CLOEXEC) < 0)
        return 2;
    pid_t me = getpid();
    pid_t child = fork();
    if (child < 0)
        return 2;
    if (child == 0) {
        int r = debugger(me, sigstop);
        if (r == 2)
            fprintf(stderr, "stopped: cannot trace: %s\n", strerror(errno));
        (void)!write(done_pipe[1], "x", 1);
        _exit(0);
    }
    (void)close(done_pipe[1]);
    (void)fcntl(done_pipe[0], F_SETFL, O_NONBLOCK);
    char c;
    while (read(done_pipe[0], &c, 1) != 1)
        big_frame();
    after_stop();
    int st;
    if (waitpid(child, &st, 0) != child || !WIFEXITED(st) || WEXITSTATUS(st) != 0)
        return 4;
    printf("done\n");
    return 0;
}
