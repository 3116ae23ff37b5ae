/* tests/programs/forker.c: a parent and forked children allocating on their own paths.
 * Prints "truth parent_alloc ..." (parent) and each child prints "truth child_alloc ...".
 *
 * Usage: forker [children]   (default 1; run one after the other) */
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#define NOINLINE __attribute__((noinline))

void *parent_alloc(size_t n);
void *child_alloc(size_t n);

NOINLINE void *parent_alloc(size_t n)
{
    void *p = malloc(n);
    __asm__ volatile("" ::: "memory");
    return p;
}

NOINLINE void *child_alloc(size_t n)
{
    void *p = malloc(n);
    __asm__ volatile("" ::: "memory");
    return p;
}

int main(int argc, char **argv)
{
    static void *volatile keep;
    int children = argc > 1 ? atoi(argv[1]) : 1;
    for (int i = 0; i < 100; i++)
        keep = parent_alloc(5000);
    fflush(stdout);
    int rc = 0;
    for (int c = 0; c < children; c++) {
        pid_t pid = fork();
        if (pid == 0) {
            for (int i = 0; i < 200; i++)
                keep = child_alloc(3000);
            printf("truth child_alloc 600000 200 0 0\n");
            fflush(stdout);
            _exit(0);
        }
        int st;
        waitpid(pid, &st, 0);
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
            rc = 1;
    }
    printf("truth parent_alloc 500000 100 0 0\n");
    (void)keep;
    return rc;
}
