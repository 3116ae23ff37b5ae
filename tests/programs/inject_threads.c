/* tests/programs/inject_threads.c: a program started without libheapprof.so that heapprof
 * attach loads it into (tests/e2e/test_inject.c).
 *
 *     inject_threads          four threads, each in a function of its own (site_t0 ..
 *                             site_t3), allocate batches of blocks of 64..2047 bytes, fill
 *                             each with a pattern, check it before freeing (exit 3 on a
 *                             mismatch), and sleep 1 ms between batches. The main thread
 *                             reads commands on stdin: "burst" makes exactly BURST
 *                             allocations of BURST_SIZE bytes in exact_site() (and frees
 *                             them), then prints "burst done"; "load PATH" dlopens the
 *                             plugin PATH (tests/programs/harm/plugin.c) and runs its
 *                             harm_plugin_run(20000), then prints "loaded SUM"; "run" runs
 *                             it again ("ran SUM"). "load_unbound PATH" dlopens it
 *                             lazily and puts the link-time value back into its malloc
 *                             slot, as the object looks while the loader relocates it
 *                             ("unbound"); "bind" then binds the slot to malloc, as
 *                             the loader would ("bound"). It prints "attached" and
 *                             "detached" as a profiling session's ring appears in and
 *                             leaves its maps. At EOF: "done", exit 0.
 *     inject_threads vfork    vfork()s; the child writes "child PID" and sleeps 10 s in
 *                             the vfork state (its parent suspended), then _exits.
 *     inject_threads strict   as the first, with a fifth thread in strict seccomp mode
 *                             (read, write, exit only) blocked in read(2) on a pipe.
 */
#include <dlfcn.h>
#include <elf.h>
#include <limits.h>
#include <link.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <linux/seccomp.h>

#define THREADS 4
#define BATCH 32
#define BURST 1000
#define BURST_SIZE 48

static atomic_bool stop;

static void fail(const char *what)
{
    fprintf(stdout, "FATAL %s\n", what);
    fflush(stdout);
    _exit(3);
}

/* One batch: frees @blocks (checking each), then allocates new ones. */
static __attribute__((noinline)) void batch(unsigned char **blocks, size_t *len, unsigned tag,
                                            uint64_t *x)
{
    for (int i = 0; i < BATCH; i++) {
        if (blocks[i]) {
            for (size_t k = 0; k < len[i]; k += 97)
                if (blocks[i][k] != (unsigned char)(tag + i))
                    fail("a block lost its fill");
            free(blocks[i]);
        }
        *x ^= *x << 13;
        *x ^= *x >> 7;
        *x ^= *x << 17;
        len[i] = 64 + *x % 1984;
        blocks[i] = malloc(len[i]);
        if (!blocks[i])
            fail("malloc failed");
        memset(blocks[i], tag + i, len[i]);
    }
}

#define SITE(n)                                                                                    \
    static __attribute__((noinline)) void site_t##n(unsigned char **b, size_t *l, uint64_t *x)     \
    {                                                                                              \
        batch(b, l, (n)*64u, x);                                                                   \
        __asm__ volatile("" ::: "memory");                                                         \
    }
SITE(0)
SITE(1)
SITE(2)
SITE(3)

static void *worker(void *arg)
{
    unsigned n = (unsigned)(uintptr_t)arg;
    unsigned char *blocks[BATCH] = {0};
    size_t len[BATCH] = {0};
    uint64_t x = 0x9e3779b97f4a7c15ull * (n + 1);
    void (*site[THREADS])(unsigned char **, size_t *, uint64_t *) = {site_t0, site_t1, site_t2,
                                                                     site_t3};
    while (!atomic_load(&stop)) {
        site[n](blocks, len, &x);
        struct timespec ms = {0, 1000000};
        nanosleep(&ms, NULL);
    }
    for (int i = 0; i < BATCH; i++)
        free(blocks[i]);
    return NULL;
}

static __attribute__((noinline)) void exact_site(void **keep)
{
    for (int i = 0; i < BURST; i++)
        keep[i] = malloc(BURST_SIZE);
    __asm__ volatile("" ::: "memory");
}

static bool has_ring(void)
{
    static char buf[1 << 16];
    FILE *f = fopen("/proc/self/maps", "r");
    bool r = false;
    if (!f)
        return false;
    while (!r && fgets(buf, sizeof(buf), f))
        r = strstr(buf, "heapprof-ring") != NULL;
    fclose(f);
    return r;
}

/* Strict seccomp: any system call but read, write, exit and sigreturn kills the process,
 * so the thread enters it only to block in a raw read(2) that never returns. */
static void *strict_thread(void *arg)
{
    const int *fds = arg; /* two pipes: fds[0] read, fds[3] written */
    char c = 's';
    if (prctl(PR_SET_SECCOMP, SECCOMP_MODE_STRICT, 0, 0, 0) != 0)
        fail("strict seccomp");
    (void)syscall(SYS_write, fds[3], &c, 1);
    for (;;)
        (void)syscall(SYS_read, fds[0], &c, 1);
    return NULL;
}

static int vfork_mode(void)
{
    pid_t p = vfork();
    if (p == 0) {
        /* Only system calls here: the parent's memory is ours until _exit. */
        char b[32] = "child ";
        long pid = syscall(SYS_getpid);
        char d[16];
        int n = 0;
        do
            d[n++] = (char)('0' + pid % 10);
        while ((pid /= 10) > 0);
        int k = 6;
        while (n > 0)
            b[k++] = d[--n];
        b[k++] = '\n';
        (void)syscall(SYS_write, 1, b, k);
        struct timespec ts = {10, 0};
        (void)syscall(SYS_nanosleep, &ts, NULL);
        syscall(SYS_exit, 0);
    }
    return p > 0 ? 0 : 1;
}

/* The JUMP_SLOT of "malloc" in the object of @h, or NULL. */
static uintptr_t *malloc_slot(void *h)
{
    struct link_map *lm = NULL;
    if (dlinfo(h, RTLD_DI_LINKMAP, &lm) != 0 || !lm)
        return NULL;
    const ElfW(Rela) *jmprel = NULL;
    const ElfW(Sym) *symtab = NULL;
    const char *strtab = NULL;
    size_t relsz = 0;
    for (const ElfW(Dyn) *d = lm->l_ld; d->d_tag != DT_NULL; d++) {
        /* The loader made the addresses absolute here (x86-64), else they are offsets. */
        uintptr_t v = d->d_un.d_ptr < lm->l_addr ? d->d_un.d_ptr + lm->l_addr : d->d_un.d_ptr;
        if (d->d_tag == DT_JMPREL)
            jmprel = (const ElfW(Rela) *)v;
        else if (d->d_tag == DT_PLTRELSZ)
            relsz = d->d_un.d_val;
        else if (d->d_tag == DT_SYMTAB)
            symtab = (const ElfW(Sym) *)v;
        else if (d->d_tag == DT_STRTAB)
            strtab = (const char *)v;
    }
    if (!jmprel || !symtab || !strtab)
        return NULL;
    for (size_t i = 0; i < relsz / sizeof(*jmprel); i++)
        if (!strcmp(strtab + symtab[ELF64_R_SYM(jmprel[i].r_info)].st_name, "malloc"))
            return (uintptr_t *)(lm->l_addr + jmprel[i].r_offset);
    return NULL;
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc > 1 && strcmp(argv[1], "vfork") == 0)
        return vfork_mode();
    if (argc > 1 && strcmp(argv[1], "strict") == 0) {
        /* fds[0]: the thread blocks there; fds[2..3]: it says it is in strict mode
         * (write(2) is allowed there), so that "ready" comes after. */
        static int fds[4];
        pthread_t st;
        char c;
        if (pipe(fds) != 0 || pipe(fds + 2) != 0 ||
            pthread_create(&st, NULL, strict_thread, fds) != 0 || read(fds[2], &c, 1) != 1)
            return 2;
    }
    pthread_t t[THREADS];
    for (unsigned i = 0; i < THREADS; i++)
        if (pthread_create(&t[i], NULL, worker, (void *)(uintptr_t)i) != 0)
            return 2;
    printf("ready\n");
    bool ring = false;
    static void *keep[BURST];
    for (;;) {
        struct pollfd pfd = {.fd = 0, .events = POLLIN};
        int r = poll(&pfd, 1, 5);
        bool now = has_ring();
        if (now != ring)
            printf("%s\n", now ? "attached" : "detached");
        ring = now;
        if (r <= 0)
            continue;
        char line[PATH_MAX + 16]; /* "load PATH" */
        ssize_t n = read(0, line, sizeof(line) - 1);
        if (n <= 0)
            break;
        line[n] = '\0';
        char *nl = strchr(line, '\n');
        if (nl)
            *nl = '\0';
        static long (*plugin_run)(int);
        static uintptr_t *unbound, bind_to;
        if (strncmp(line, "load ", 5) == 0) {
            void *h = dlopen(line + 5, RTLD_NOW);
            plugin_run = h ? (long (*)(int))dlsym(h, "harm_plugin_run") : NULL;
            if (!plugin_run)
                fail("the plugin did not load");
            printf("loaded %ld\n", plugin_run(20000));
        } else if (strncmp(line, "load_unbound ", 13) == 0) {
            void *h = dlopen(line + 13, RTLD_LAZY);
            plugin_run = h ? (long (*)(int))dlsym(h, "harm_plugin_run") : NULL;
            unbound = h ? malloc_slot(h) : NULL;
            struct link_map *lm = NULL;
            if (!plugin_run || !unbound || dlinfo(h, RTLD_DI_LINKMAP, &lm) != 0)
                fail("the plugin did not load");
            /* Lazily bound: the slot holds its PLT entry, the link-time value + bias. What
             * the loader binds it to: the C library's, looked up before any attach. */
            *unbound -= lm->l_addr;
            bind_to = (uintptr_t)dlsym(RTLD_DEFAULT, "malloc");
            printf("unbound\n");
        } else if (strcmp(line, "bind") == 0 && unbound) {
            *unbound = bind_to;
            printf("bound\n");
        } else if (strcmp(line, "run") == 0 && plugin_run) {
            printf("ran %ld\n", plugin_run(20000));
        }
        if (strncmp(line, "burst", 5) == 0) {
            exact_site(keep);
            for (int i = 0; i < BURST; i++)
                free(keep[i]);
            printf("burst done\n");
        }
    }
    atomic_store(&stop, true);
    for (unsigned i = 0; i < THREADS; i++)
        pthread_join(t[i], NULL);
    printf("done\n");
    return 0;
}
