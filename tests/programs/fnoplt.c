/* tests/programs/fnoplt.c: a program built with -fno-plt, which calls malloc through its
 * GLOB_DAT slot of it (`call *malloc@GOTPCREL(%rip)`), for tests/e2e/test_inject.c.
 *
 * Built twice. fnoplt_calls only calls malloc and free: the slot is a call path, which
 * a session must switch to see the calls. fnoplt_compare also takes malloc's address
 * (through the same slot) at its start and compares it with `&malloc` every
 * millisecond, as code that checks whether an allocator callback is the default one
 * does: a session that switched the slot made the two differ.
 *
 * Prints "ready", allocates in fnoplt_alloc() every millisecond until EOF on stdin,
 * prints "done" (or a line with FATAL and exits 1 when `&malloc` changed). */
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void *volatile sink;

void fnoplt_alloc(void);
__attribute__((noinline)) void fnoplt_alloc(void)
{
    for (int i = 0; i < 8; i++) {
        char *p = malloc(4096);
        memset(p, i, 4096);
        sink = p;
        free(p);
    }
}

#ifdef FNOPLT_COMPARE
typedef void *(*malloc_fn)(size_t);
static volatile malloc_fn at_start;

/* Reads &malloc anew at each call (inline, the compiler keeps it in a register). */
__attribute__((noinline)) static int malloc_moved(void)
{
    return at_start != malloc;
}
#endif

int main(void)
{
    setvbuf(stdout, NULL, _IONBF, 0);
#ifdef FNOPLT_COMPARE
    at_start = malloc;
#endif
    printf("ready\n");
    struct pollfd in = {.fd = 0, .events = POLLIN};
    for (;;) {
        fnoplt_alloc();
#ifdef FNOPLT_COMPARE
        if (malloc_moved()) {
            printf("FATAL: &malloc changed while the program ran\n");
            return 1;
        }
#endif
        if (poll(&in, 1, 1) > 0) {
            char buf[64];
            if (read(0, buf, sizeof(buf)) <= 0)
                break;
        }
    }
    printf("done\n");
    return 0;
}
