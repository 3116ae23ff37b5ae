/* tests/programs/slotwatch.c: watches where its own PLT slot of malloc leads, for
 * tests/e2e/test_attach.c (dormant means free, issue 15 case 6).
 *
 * For @ms milliseconds it allocates (in slotwatch_alloc, some blocks kept live) and looks
 * at its JUMP_SLOT of malloc every millisecond, printing a line each time what the slot
 * holds changes: "direct" (a function of libc.so), "hooked" (one of libheapprof.so),
 * "lazy" (not bound yet) or "other". Every 300 ms a forked child prints "child STATE" the
 * same way and exits. Ends with "done", also earlier on SIGTERM (a test that gives it
 * long enough for a loaded machine and ends it when it is done).
 *
 *     slotwatch MS
 */
#include <dlfcn.h>
#include <elf.h>
#include <link.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static uintptr_t *malloc_slot;

static uintptr_t dyn_ptr(uintptr_t bias, uintptr_t v)
{
    return (bias != 0 && v < bias) ? bias + v : v;
}

/* The executable is the first object dl_iterate_phdr reports. */
static int find_slot(struct dl_phdr_info *info, size_t size, void *arg)
{
    (void)size;
    (void)arg;
    const Elf64_Dyn *dyn = NULL;
    for (unsigned i = 0; i < info->dlpi_phnum; i++)
        if (info->dlpi_phdr[i].p_type == PT_DYNAMIC)
            dyn = (const Elf64_Dyn *)(info->dlpi_addr + info->dlpi_phdr[i].p_vaddr);
    const Elf64_Rela *jmprel = NULL;
    const Elf64_Sym *symtab = NULL;
    const char *strtab = NULL;
    size_t jmprelsz = 0;
    for (; dyn && dyn->d_tag != DT_NULL; dyn++) {
        if (dyn->d_tag == DT_JMPREL)
            jmprel = (const Elf64_Rela *)dyn_ptr(info->dlpi_addr, dyn->d_un.d_ptr);
        else if (dyn->d_tag == DT_PLTRELSZ)
            jmprelsz = dyn->d_un.d_val;
        else if (dyn->d_tag == DT_SYMTAB)
            symtab = (const Elf64_Sym *)dyn_ptr(info->dlpi_addr, dyn->d_un.d_ptr);
        else if (dyn->d_tag == DT_STRTAB)
            strtab = (const char *)dyn_ptr(info->dlpi_addr, dyn->d_un.d_ptr);
    }
    for (size_t i = 0; jmprel && symtab && strtab && i < jmprelsz / sizeof(Elf64_Rela); i++) {
        const Elf64_Rela *r = &jmprel[i];
        if (ELF64_R_TYPE(r->r_info) == R_X86_64_JUMP_SLOT &&
            strcmp(strtab + symtab[ELF64_R_SYM(r->r_info)].st_name, "malloc") == 0)
            malloc_slot = (uintptr_t *)(info->dlpi_addr + r->r_offset);
    }
    return 1;
}

static const char *slot_state(void)
{
    Dl_info di;
    uintptr_t v = *(volatile uintptr_t *)malloc_slot;
    if (!dladdr((void *)v, &di) || !di.dli_fname)
        return "other";
    if (strstr(di.dli_fname, "libheapprof"))
        return "hooked";
    if (strstr(di.dli_fname, "libc.so"))
        return "direct";
    return di.dli_saddr == (void *)v ? "other" : "lazy";
}

static void say(const char *s)
{
    char line[64];
    int n = snprintf(line, sizeof(line), "%s\n", s);
    (void)!write(1, line, (size_t)n);
}

static void *live[64];

void slotwatch_alloc(unsigned i);
__attribute__((noinline)) void slotwatch_alloc(unsigned i)
{
    free(live[i % 64]);
    live[i % 64] = malloc(64 + (i * 97) % 8000);
    if (live[i % 64])
        memset(live[i % 64], (int)i, 8);
}

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static volatile sig_atomic_t stop;

static void on_term(int sig)
{
    (void)sig;
    stop = 1;
}

int main(int argc, char **argv)
{
    uint64_t ms = argc > 1 ? strtoull(argv[1], NULL, 10) : 3000;
    signal(SIGTERM, on_term);
    dl_iterate_phdr(find_slot, NULL);
    if (!malloc_slot) {
        say("noslot");
        return 1;
    }
    /* Bound (when lazy) by a first call. */
    slotwatch_alloc(0);
    const char *last = NULL;
    uint64_t start = now_ms(), next_fork = start + 300;
    for (unsigned i = 1; now_ms() - start < ms && !stop; i++) {
        for (unsigned k = 0; k < 100; k++)
            slotwatch_alloc(i * 100 + k);
        const char *s = slot_state();
        if (s != last)
            say(s);
        last = s;
        if (now_ms() >= next_fork) {
            next_fork += 300;
            pid_t c = fork();
            if (c == 0) {
                slotwatch_alloc(1);
                char line[32];
                snprintf(line, sizeof(line), "child %s", slot_state());
                say(line);
                _exit(0);
            }
            int st;
            if (c < 0 || waitpid(c, &st, 0) != c || !WIFEXITED(st) || WEXITSTATUS(st) != 0)
                say("child failed");
        }
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
    for (unsigned i = 0; i < 64; i++)
        free(live[i]);
    say("done");
    return 0;
}
