/* tests/programs/setuid_drop.c: a server that starts as root and drops to another user,
 * as nginx's workers and apache's children do: it allocates on before_drop(), switches
 * its groups, gid and uid with the glibc calls (which change every thread glibc knows),
 * lets the profiler's session thread notice (it looks every 200 ms), then allocates on
 * after_drop().
 *
 *     setuid_drop UID GID [nodump]
 *
 * After the drop it makes itself dumpable again (as nginx does), unless "nodump" is
 * given: the kernel then keeps its /proc files root's. It prints "truth" lines for both
 * sites and "root_threads N": the threads of the process still running as root after
 * the drop (the profiler's must not be one of them). Exit status 0, or 2 when the drop
 * failed. */
#include <dirent.h>
#include <grp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <time.h>
#include <unistd.h>

#define NOINLINE __attribute__((noinline))

void *before_drop(size_t n);
void *after_drop(size_t n);

NOINLINE void *before_drop(size_t n)
{
    void *p = malloc(n);
    __asm__ volatile("" ::: "memory");
    return p;
}

NOINLINE void *after_drop(size_t n)
{
    void *p = malloc(n);
    __asm__ volatile("" ::: "memory");
    return p;
}

static void sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0)
        ;
}

/* Threads of this process whose effective uid is 0. */
static int root_threads(int *ret_all)
{
    *ret_all = 0;
    DIR *d = opendir("/proc/self/task");
    if (!d)
        return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.')
            continue;
        (*ret_all)++;
        char path[300], buf[4096];
        snprintf(path, sizeof(path), "/proc/self/task/%s/status", e->d_name);
        FILE *f = fopen(path, "r");
        if (!f)
            continue;
        size_t len = fread(buf, 1, sizeof(buf) - 1, f);
        fclose(f);
        buf[len] = '\0';
        const char *u = strstr(buf, "\nUid:");
        unsigned r, eu;
        if (u && sscanf(u + 5, "%u %u", &r, &eu) == 2 && eu == 0)
            n++;
    }
    closedir(d);
    return n;
}

int main(int argc, char **argv)
{
    if (argc < 3)
        return 2;
    uid_t uid = (uid_t)strtoul(argv[1], NULL, 10);
    gid_t gid = (gid_t)strtoul(argv[2], NULL, 10);
    int dumpable = !(argc > 3 && !strcmp(argv[3], "nodump"));
    static void *volatile keep;

    for (int i = 0; i < 100; i++)
        keep = before_drop(5000);
    if (setgroups(1, &gid) != 0 || setgid(gid) != 0 || setuid(uid) != 0) {
        perror("setuid_drop");
        return 2;
    }
    if (dumpable)
        (void)prctl(PR_SET_DUMPABLE, 1, 0, 0, 0);
    sleep_ms(600);
    for (int i = 0; i < 200; i++)
        keep = after_drop(3000);
    printf("truth before_drop 500000 100 0 0\n");
    printf("truth after_drop 600000 200 0 0\n");
    int all, root = root_threads(&all);
    printf("root_threads %d\nthreads %d\n", root, all);
    fflush(stdout);
    (void)keep;
    return 0;
}
