/* tests/programs/execer.c: leaves known allocations live, then runs a program by fork+exec
 * and/or replaces itself with it (same pid).
 *
 * Usage: execer MODE PROG [ARGS...]
 *   exec  become PROG (execv)
 *   fork  fork+exec PROG, wait for it, exit with its status
 *   both  fork+exec PROG and wait for it, then become PROG
 * Prints its ground truth "truth execer_alloc A B C D" (see three_sites.c) before running
 * anything, and "child status N" after a fork+exec. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define NOINLINE __attribute__((noinline))

/* Not static: its name must appear in the profile's stacks. */
void *execer_alloc(size_t n);

NOINLINE void *execer_alloc(size_t n)
{
    void *p = malloc(n);
    __asm__ volatile("" ::: "memory");
    return p;
}

static void run_exec(char **argv)
{
    execv(argv[0], argv);
    perror("execer: execv");
    _exit(127);
}

int main(int argc, char **argv)
{
    static void *volatile keep[100];
    if (argc < 3 ||
        (strcmp(argv[1], "exec") && strcmp(argv[1], "fork") && strcmp(argv[1], "both"))) {
        fprintf(stderr, "usage: execer exec|fork|both PROG [ARGS...]\n");
        return 2;
    }
    /* 100 blocks of 5000 bytes stay live across the exec, 50 of 3000 are freed. */
    for (int i = 0; i < 100; i++)
        keep[i] = execer_alloc(5000);
    (void)keep;
    for (int i = 0; i < 50; i++)
        free(execer_alloc(3000));
    printf("truth execer_alloc 650000 150 150000 50\n");
    fflush(stdout);

    if (strcmp(argv[1], "exec") != 0) {
        pid_t pid = fork();
        if (pid < 0) {
            perror("execer: fork");
            return 1;
        }
        if (pid == 0)
            run_exec(argv + 2);
        int st;
        if (waitpid(pid, &st, 0) < 0) {
            perror("execer: waitpid");
            return 1;
        }
        int code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        printf("child status %d\n", code);
        fflush(stdout);
        if (strcmp(argv[1], "fork") == 0)
            return code;
    }
    run_exec(argv + 2);
    return 1;
}
