/* tests/programs/harm/altstack.c: a signal handler that allocates, running on a
 * sigaltstack (issue 15, case 4): first one of SIGSTKSZ bytes, then a small one (the
 * system's minimum plus 3 KiB), where every byte the sampled path puts on the stack
 * counts. The signals are raised by the program itself, outside malloc.
 *
 * Prints what the handler computed; exits 0. */
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

static volatile sig_atomic_t handled;
static unsigned long sum;

static __attribute__((noinline)) unsigned long handler_work(int i)
{
    size_t n = i % 2 ? 8192 : 100;
    unsigned char *p = malloc(n);
    if (!p)
        abort();
    memset(p, i, n);
    unsigned long s = p[n - 1];
    free(p);
    return s;
}

static void on_signal(int sig)
{
    (void)sig;
    for (int i = 0; i < 4; i++)
        sum += handler_work((int)handled + i);
    handled = handled + 1;
}

static void run_on(size_t size, int signals)
{
    /* Its own mapping, with nothing readable right above it. */
    size_t pages = (size + 4095) / 4096 * 4096;
    char *m = mmap(NULL, pages + 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED || mprotect(m + pages, 4096, PROT_NONE) != 0)
        abort();
    stack_t ss = {.ss_sp = m + pages - size, .ss_size = size, .ss_flags = 0};
    if (sigaltstack(&ss, NULL) != 0)
        abort();
    for (int i = 0; i < signals; i++)
        raise(SIGUSR1);
    ss.ss_flags = SS_DISABLE;
    if (sigaltstack(&ss, NULL) != 0)
        abort();
    munmap(m, pages + 4096);
}

int main(void)
{
    struct sigaction sa = {.sa_handler = on_signal, .sa_flags = SA_ONSTACK};
    sigemptyset(&sa.sa_mask);
    if (sigaction(SIGUSR1, &sa, NULL) != 0)
        return 1;
    long big = sysconf(_SC_SIGSTKSZ), min = sysconf(_SC_MINSIGSTKSZ);
    if (big < 16384)
        big = 16384;
    if (min < 2048)
        min = 2048;
    run_on((size_t)big, 200);
    run_on((size_t)min + 3072, 200);
    printf("handled %d, sum %lu\n", (int)handled, sum);
    return 0;
}
