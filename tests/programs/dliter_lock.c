/* tests/programs/dliter_lock.c: a correct program that lists its modules with
 * dl_iterate_phdr() and takes its log mutex inside the callback, while another thread
 * formats log lines under that mutex into 8 KiB it allocates (tests/e2e/test_attach_dl.c).
 * With any malloc that never takes the loader's lock it runs forever; a malloc that waits
 * for that lock deadlocks it (the logger holds the mutex and waits for the lock, the
 * lister holds the lock and waits for the mutex).
 *
 * Usage: dliter_lock PROGRESS_FILE
 * Prints "ready", then rewrites PROGRESS_FILE every 10 ms with "listed N logged M" (the
 * modules listed and the lines logged so far); at EOF on stdin it stops both threads and
 * prints "done". */
#include <fcntl.h>
#include <link.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static pthread_mutex_t log_mu = PTHREAD_MUTEX_INITIALIZER;
static _Atomic unsigned long listed, logged;
static atomic_bool stop;
static char *volatile last_line;

static int list_cb(struct dl_phdr_info *info, size_t size, void *data)
{
    (void)size;
    (void)data;
    pthread_mutex_lock(&log_mu);
    if (info->dlpi_name)
        atomic_fetch_add(&listed, 1);
    pthread_mutex_unlock(&log_mu);
    return 0;
}

static void *lister(void *arg)
{
    (void)arg;
    while (!atomic_load(&stop))
        dl_iterate_phdr(list_cb, NULL);
    return NULL;
}

/* One log line, formatted under the mutex into a buffer it allocates. */
void dliter_log_line(unsigned long n);
__attribute__((noinline)) void dliter_log_line(unsigned long n)
{
    pthread_mutex_lock(&log_mu);
    char *line = malloc(8192);
    if (!line)
        abort();
    snprintf(line, 8192, "line %lu of the log, %lu modules listed so far", n, atomic_load(&listed));
    free(last_line);
    last_line = line;
    atomic_fetch_add(&logged, 1);
    pthread_mutex_unlock(&log_mu);
}

static void *logger(void *arg)
{
    (void)arg;
    for (unsigned long n = 0; !atomic_load(&stop); n++)
        dliter_log_line(n);
    return NULL;
}

static void write_progress(int fd)
{
    char buf[96];
    int n = snprintf(buf, sizeof(buf), "listed %lu logged %lu\n", atomic_load(&listed),
                     atomic_load(&logged));
    if (ftruncate(fd, 0) < 0 || pwrite(fd, buf, (size_t)n, 0) != n)
        abort();
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: dliter_lock PROGRESS_FILE\n");
        return 2;
    }
    int fd = open(argv[1], O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0)
        return 1;
    pthread_t l, g;
    if (pthread_create(&l, NULL, lister, NULL) != 0 || pthread_create(&g, NULL, logger, NULL) != 0)
        return 1;
    printf("ready\n");
    fflush(stdout);
    for (;;) {
        write_progress(fd);
        struct pollfd p = {.fd = 0, .events = POLLIN};
        if (poll(&p, 1, 10) > 0) {
            char c;
            if (read(0, &c, 1) <= 0)
                break;
        }
    }
    atomic_store(&stop, true);
    pthread_join(l, NULL);
    pthread_join(g, NULL);
    write_progress(fd);
    close(fd);
    free(last_line);
    printf("done\n");
    return 0;
}
