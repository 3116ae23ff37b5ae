/* tests/programs/attach_cli_target.c: processes `heapprof attach` must find and name the
 * way users see them, or refuse with the real cause (tests/e2e/test_attach_cli.c).
 *
 *   attach_cli_target [--title TITLE] [--comm COMM] [--nodump] [PADDING...]
 *
 *   --title TITLE   rewrites its argument area with TITLE, NUL-padded, the way nginx and
 *                   postgres retitle their processes ("nginx: master process ...",
 *                   "postgres: checkpointer"): /proc/PID/cmdline then holds the title
 *   --comm COMM     sets its name (/proc/PID/comm) with prctl(PR_SET_NAME)
 *   --nodump        prctl(PR_SET_DUMPABLE, 0), as ssh-agent and gpg-agent do
 *
 * The arguments must be long enough for the title (PADDING arguments make room). Prints
 * "ready" once set up, allocates through attach_cli_alloc() every 10 ms, and ends with
 * "done" at EOF on stdin. */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <time.h>
#include <unistd.h>

static void *volatile sink;

void attach_cli_alloc(void);
__attribute__((noinline)) void attach_cli_alloc(void)
{
    char *p = malloc(1000);
    memset(p, 1, 1000);
    sink = p;
    free(p);
}

/* True at EOF on stdin (not blocking). */
static int stdin_closed(void)
{
    struct pollfd p = {.fd = 0, .events = POLLIN};
    if (poll(&p, 1, 0) <= 0)
        return 0;
    char buf[64];
    return read(0, buf, sizeof(buf)) == 0;
}

/* Writes @title over argv[0..argc), which lie end to end in memory, NUL-padding the
 * rest. Returns -1 when the area is too small. */
static int retitle(int argc, char **argv, const char *title)
{
    char *start = argv[0], *end = argv[argc - 1] + strlen(argv[argc - 1]) + 1;
    size_t n = strlen(title) + 1;
    if (n > (size_t)(end - start))
        return -1;
    char copy[4096];
    snprintf(copy, sizeof(copy), "%s", title); /* @title lives in that area too */
    memset(start, 0, (size_t)(end - start));
    memcpy(start, copy, n);
    return 0;
}

int main(int argc, char **argv)
{
    const char *title = NULL, *comm = NULL;
    int nodump = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--title") == 0 && i + 1 < argc)
            title = argv[++i];
        else if (strcmp(argv[i], "--comm") == 0 && i + 1 < argc)
            comm = argv[++i];
        else if (strcmp(argv[i], "--nodump") == 0)
            nodump = 1;
    }
    if (nodump && prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) < 0) {
        printf("FATAL: PR_SET_DUMPABLE: %s\n", strerror(errno));
        return 1;
    }
    if (comm && prctl(PR_SET_NAME, comm, 0, 0, 0) < 0) {
        printf("FATAL: PR_SET_NAME: %s\n", strerror(errno));
        return 1;
    }
    if (title && retitle(argc, argv, title) < 0) {
        printf("FATAL: no room for the title\n");
        return 1;
    }
    printf("ready\n");
    fflush(stdout);
    while (!stdin_closed()) {
        struct timespec ts = {0, 10000000};
        nanosleep(&ts, NULL);
        attach_cli_alloc();
    }
    printf("done\n");
    return 0;
}
