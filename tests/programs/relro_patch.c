/* tests/programs/relro_patch.c: a full-RELRO PIE (-z relro -z now) that patches its own
 * read-only relocated data at run time, as GOT/PLT hooking libraries and hot patchers do,
 * for tests/e2e/test_attach_relro.c. Every 100 us it allocates (relro_patch_alloc, through
 * its own malloc slot, which lies in the RELRO pages); it re-points `op`, a function
 * pointer in .data.rel.ro, and calls through it, every millisecond (or more often).
 *
 *   keep         makes the page of `op` writable once and keeps it so
 *   restore      every 100 us: mprotect RW, patch, sleep 50 us, patch, mprotect R
 *   sandbox      no patching; once a second thread appears (a profiling session's),
 *                installs a seccomp filter on every thread that makes mprotect fail with
 *                EPERM (a sandbox that tightens after start-up, W^X style)
 *   sandbox_mem  the same, and the filter denies writes to files at an offset too
 *                (pwrite64, pwritev, pwritev2) and process_vm_writev
 *
 * Runs until EOF on stdin. Prints "ready" once set up and "done" at the end; a line
 * with FATAL when a patch or a call went wrong, or when the page of `op` does not have the
 * protection the program gave it.
 *
 *     relro_patch MODE
 */
#include <errno.h>
#include <poll.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>

static int op_one(int x)
{
    return x + 1;
}

static int op_two(int x)
{
    return x + 2;
}

/* Initialised with an address: relocated at load, so in .data.rel.ro, read-only after. */
static int (*const op)(int) = op_one;

/* Reads and writes of `op` that the compiler cannot fold. */
static int (*volatile *const op_at)(int) = (int (*volatile *)(int)) & op;

static void *volatile blocks[64];
static uintptr_t page;
static size_t page_size;

void relro_patch_alloc(unsigned i);
__attribute__((noinline)) void relro_patch_alloc(unsigned i)
{
    free(blocks[i % 64]);
    blocks[i % 64] = malloc(1000 + i % 100);
}

static int fatal(const char *what)
{
    printf("FATAL: %s: %s\n", what, strerror(errno));
    fflush(stdout);
    return 1;
}

/* Re-points `op` and checks the call through it. */
static int patch(unsigned n)
{
    int (*want)(int) = n % 2 ? op_two : op_one;
    *op_at = want;
    if (*op_at != want || (*op_at)(40) != (n % 2 ? 42 : 41)) {
        errno = 0;
        return fatal("call through the patched pointer");
    }
    return 0;
}

/* The protection of the page of `op` in /proc/self/maps: "r-" or "rw". */
static int page_prot(char prot[3])
{
    FILE *f = fopen("/proc/self/maps", "r");
    char line[512];
    while (f && fgets(line, sizeof(line), f)) {
        unsigned long lo, hi;
        char perms[5];
        if (sscanf(line, "%lx-%lx %4s", &lo, &hi, perms) == 3 && page >= lo && page < hi) {
            memcpy(prot, perms, 2);
            prot[2] = '\0';
            fclose(f);
            return 0;
        }
    }
    if (f)
        fclose(f);
    errno = ENOENT;
    return -1;
}

static int threads(void)
{
    FILE *f = fopen("/proc/self/stat", "r");
    char buf[1024];
    size_t n = f ? fread(buf, 1, sizeof(buf) - 1, f) : 0;
    if (f)
        fclose(f);
    buf[n] = '\0';
    const char *p = strrchr(buf, ')');
    int field = 2, count = 0;
    for (; p && *p; p++)
        if (*p == ' ' && ++field == 20)
            count = atoi(p + 1);
    return count;
}

/* Denies mprotect and, when @writes, pwrite64, pwritev, pwritev2 and process_vm_writev,
 * with EPERM, on every thread. */
static int sandbox(bool writes)
{
    struct sock_filter f[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_X86_64, 1, 0),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_mprotect, 5, 0),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, writes ? SYS_pwrite64 : SYS_mprotect, 4, 0),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, writes ? SYS_pwritev : SYS_mprotect, 3, 0),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, writes ? SYS_pwritev2 : SYS_mprotect, 2, 0),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, writes ? SYS_process_vm_writev : SYS_mprotect, 1, 0),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EPERM),
    };
    struct sock_fprog prog = {.len = sizeof(f) / sizeof(f[0]), .filter = f};
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0 ||
        syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_TSYNC, &prog) != 0)
        return fatal("seccomp");
    return 0;
}

/* Round @n of @mode (every 100 us): returns 0, or 1 after printing a FATAL line. */
static int round_of(const char *mode, unsigned n, bool *sandboxed)
{
    int r = 0;
    if (strcmp(mode, "keep") == 0) {
        r = n % 10 == 0 ? patch(n / 10) : 0;
    } else if (strcmp(mode, "restore") == 0) {
        /* A batch of patches between the two mprotect calls: the page is writable for
         * a while, a third of the time. */
        if (mprotect((void *)page, page_size, PROT_READ | PROT_WRITE) < 0)
            return fatal("mprotect RW");
        r = patch(2 * n);
        struct timespec ts = {0, 50000};
        nanosleep(&ts, NULL);
        r = r ? r : patch(2 * n + 1);
        if (mprotect((void *)page, page_size, PROT_READ) < 0)
            return fatal("mprotect R");
    } else if (!*sandboxed && threads() > 1) {
        *sandboxed = true;
        r = sandbox(strcmp(mode, "sandbox_mem") == 0);
    }
    return r;
}

static int check_prot(const char *want)
{
    char prot[3];
    if (page_prot(prot) < 0)
        return fatal("maps");
    if (strcmp(prot, want) != 0) {
        printf("FATAL: the page of op is %s, the program made it %s\n", prot, want);
        return 1;
    }
    return 0;
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "";
    if (strcmp(mode, "keep") != 0 && strcmp(mode, "restore") != 0 && strcmp(mode, "sandbox") != 0 &&
        strcmp(mode, "sandbox_mem") != 0) {
        fprintf(stderr, "usage: relro_patch keep|restore|sandbox|sandbox_mem\n");
        return 2;
    }
    page_size = (size_t)sysconf(_SC_PAGESIZE);
    page = (uintptr_t)&op & ~(uintptr_t)(page_size - 1);
    if (check_prot("r-"))
        return 1; /* not built with RELRO */
    if (strcmp(mode, "keep") == 0 && mprotect((void *)page, page_size, PROT_READ | PROT_WRITE) < 0)
        return fatal("mprotect RW");
    const char *want = strcmp(mode, "keep") == 0 ? "rw" : "r-";
    printf("ready\n");
    fflush(stdout);
    bool sandboxed = false;
    for (unsigned n = 0;; n++) {
        struct pollfd in = {.fd = 0, .events = POLLIN};
        if (poll(&in, 1, 0) > 0)
            break;
        relro_patch_alloc(n);
        if (round_of(mode, n, &sandboxed))
            return 1;
        if (n % 1000 == 0 && check_prot(want))
            return 1;
        struct timespec ts = {0, 100000};
        nanosleep(&ts, NULL);
    }
    if (check_prot(want))
        return 1;
    printf("done\n");
    return 0;
}
