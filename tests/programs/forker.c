/* tests/programs/forker.c: a parent and a forked child allocating on their own paths.
 * Prints "truth parent_alloc ..." (parent) and the child prints "truth child_alloc ...". */
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

int main(void)
{
    static void *volatile keep;
    for (int i = 0; i < 100; i++)
        keep = parent_alloc(5000);
    fflush(stdout);
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
    printf("truth parent_alloc 500000 100 0 0\n");
    (void)keep;
    return WIFEXITED(st) ? WEXITSTATUS(st) : 1;
}
