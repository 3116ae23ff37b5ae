/* tests/programs/retitle.c: a server that names its processes by their roles, as nginx
 * and postgres do (tests/e2e/test_names.c). The parent forks a worker; each overwrites
 * its argv area with a title, the worker padding it with NULs, the parent with spaces
 * (setproctitle's two habits), and allocates in a function of its own. Both live
 * @ms milliseconds after retitling, then the parent reaps the worker and prints "done".
 * With RETITLE_LATE_MS set, the worker allocates first (its session starts under the
 * command line it inherited), idles that long, and only then takes its title, as an
 * nginx worker does after its setup.
 *
 *     retitle MS PADDING...   (PADDING: any arguments, room for the titles)
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static void *volatile sink;

void retitle_worker_alloc(void);
__attribute__((noinline)) void retitle_worker_alloc(void)
{
    for (int i = 0; i < 100; i++)
        sink = malloc(1000); /* kept */
}

void retitle_master_alloc(void);
__attribute__((noinline)) void retitle_master_alloc(void)
{
    for (int i = 0; i < 50; i++)
        sink = malloc(3000); /* kept */
}

/* Writes @title over the argv area [@area, @area + @len), padded with @pad and ended by
 * a NUL. */
static void set_title(char *area, size_t len, const char *title, char pad)
{
    memset(area, pad, len - 1);
    area[len - 1] = '\0';
    memcpy(area, title, strlen(title) < len - 1 ? strlen(title) : len - 1);
}

static void sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000};
    nanosleep(&ts, NULL);
}

int main(int argc, char **argv)
{
    if (argc < 3)
        return 2;
    setvbuf(stdout, NULL, _IONBF, 0);
    long ms = atol(argv[1]);
    char *area = argv[0];
    size_t len = (size_t)(argv[argc - 1] + strlen(argv[argc - 1]) + 1 - area);
    pid_t w = fork();
    if (w < 0)
        return 1;
    if (w == 0) {
        const char *late = getenv("RETITLE_LATE_MS");
        if (late) {
            retitle_worker_alloc();
            sleep_ms(atol(late));
        }
        set_title(area, len, "retitle: worker process", '\0');
        prctl(PR_SET_NAME, "retitle-worker");
        if (!late)
            retitle_worker_alloc();
        sleep_ms(ms);
        exit(0); /* as a server's worker does: exit handlers run */
    }
    set_title(area, len, "retitle: master process", ' ');
    retitle_master_alloc();
    sleep_ms(ms);
    int st;
    if (waitpid(w, &st, 0) != w || !WIFEXITED(st) || WEXITSTATUS(st) != 0)
        return 1;
    printf("done\n");
    return 0;
}
