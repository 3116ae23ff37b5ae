/* tests/programs/wake_refused.c: processes an attach must refuse, unharmed
 * (tests/e2e/test_attach_matrix.c, tests/e2e/test_wake.c).
 *
 *   seccomp trap|kill|errno   installs a seccomp filter that denies socket(2) with
 *                             SECCOMP_RET_TRAP (a SIGSYS handler makes it fail with EPERM),
 *                             SECCOMP_RET_KILL_PROCESS or SECCOMP_RET_ERRNO, checks its own
 *                             socket() fails politely (not in kill mode), then allocates
 *                             until EOF on stdin
 *   tracer PROG ARGS...       runs PROG traced by us (PTRACE_SEIZE), passing its signals
 *                             on; prints "child PID", exits with its status
 *
 * Prints "ready" once set up, "done" at the end. */
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/ptrace.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>

static void *volatile sink;

void wake_refused_alloc(void);
__attribute__((noinline)) void wake_refused_alloc(void)
{
    sink = malloc(1000);
}

static void on_sigsys(int sig, siginfo_t *si, void *uc)
{
    (void)sig;
    (void)si;
    ucontext_t *u = uc;
    u->uc_mcontext.gregs[REG_RAX] = -EPERM; /* the denied call fails politely */
}

static int seccomp_mode(const char *how)
{
    unsigned action;
    if (strcmp(how, "trap") == 0) {
        action = SECCOMP_RET_TRAP;
        struct sigaction sa = {.sa_sigaction = on_sigsys, .sa_flags = SA_SIGINFO};
        sigemptyset(&sa.sa_mask);
        sigaction(SIGSYS, &sa, NULL);
    } else if (strcmp(how, "kill") == 0) {
        action = SECCOMP_RET_KILL_PROCESS;
    } else {
        action = SECCOMP_RET_ERRNO | EPERM;
    }
    struct sock_filter f[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_X86_64, 1, 0),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_socket, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, action),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    struct sock_fprog prog = {.len = sizeof(f) / sizeof(f[0]), .filter = f};
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0 ||
        prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog) < 0) {
        printf("FATAL: seccomp: %s\n", strerror(errno));
        return 1;
    }
    if (strcmp(how, "kill") != 0) {
        int s = socket(AF_UNIX, SOCK_STREAM, 0);
        if (s >= 0 || errno != EPERM) {
            printf("FATAL: socket() was not denied\n");
            return 1;
        }
    }
    printf("ready\n");
    fflush(stdout);
    for (;;) {
        struct pollfd p = {.fd = 0, .events = POLLIN};
        int n = poll(&p, 1, 20);
        if (n < 0 && errno != EINTR) {
            printf("FATAL: poll: %s\n", strerror(errno));
            return 1;
        }
        char buf[64];
        if (n == 1 && read(0, buf, sizeof(buf)) == 0)
            break;
        wake_refused_alloc();
    }
    printf("done\n");
    return 0;
}

static int tracer_mode(char **argv)
{
    pid_t c = fork();
    if (c == 0) {
        execv(argv[0], argv);
        _exit(127);
    }
    if (ptrace(PTRACE_SEIZE, c, 0, 0) < 0) {
        printf("FATAL: PTRACE_SEIZE: %s\n", strerror(errno));
        return 1;
    }
    printf("child %d\n", (int)c);
    fflush(stdout);
    for (;;) {
        int st;
        if (waitpid(c, &st, __WALL) != c)
            return 1;
        if (WIFEXITED(st))
            return WEXITSTATUS(st);
        if (WIFSIGNALED(st))
            return 128 + WTERMSIG(st);
        int sig = (st >> 16) == 0 ? WSTOPSIG(st) : 0;
        ptrace(PTRACE_CONT, c, 0, (void *)(long)sig);
    }
}

int main(int argc, char **argv)
{
    if (argc > 2 && strcmp(argv[1], "seccomp") == 0)
        return seccomp_mode(argv[2]);
    if (argc > 2 && strcmp(argv[1], "tracer") == 0)
        return tracer_mode(argv + 2);
    fprintf(stderr, "usage: wake_refused seccomp trap|kill|errno | tracer PROG ARGS...\n");
    return 2;
}
