/* tests/bench/bench_util.c: see bench_util.h. */
#include "tests/bench/bench_util.h"

#include <errno.h>
#include <fcntl.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

int bench_build_dir(char *buf, size_t len)
{
    const char *env = getenv("HEAPPROF_BUILD");
    if (env) {
        snprintf(buf, len, "%s", env);
        return 0;
    }
    ssize_t n = readlink("/proc/self/exe", buf, len - 1);
    if (n <= 0)
        return -1;
    buf[n] = 0;
    for (int i = 0; i < 3; i++) {
        char *slash = strrchr(buf, '/');
        if (!slash)
            return -1;
        *slash = 0;
    }
    return 0;
}

int bench_run_stderr(char *const argv[], char *out, size_t cap)
{
    int p[2];
    if (pipe(p) < 0)
        return -1;
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, p[1], 2);
    posix_spawn_file_actions_addclose(&fa, p[0]);
    posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
    pid_t pid;
    int r = posix_spawn(&pid, argv[0], &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    (void)close(p[1]);
    if (r != 0) {
        (void)close(p[0]);
        return -1;
    }
    size_t len = 0;
    for (;;) {
        ssize_t n = read(p[0], out + len, cap - 1 - len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            break;
        len += (size_t)n;
    }
    out[len] = 0;
    (void)close(p[0]);
    int st;
    if (waitpid(pid, &st, 0) != pid || !WIFEXITED(st))
        return -1;
    return WEXITSTATUS(st);
}

int bench_tmp_trace(char *buf, size_t len)
{
    snprintf(buf, len, "/tmp/heapprof-bench-XXXXXX");
    int fd = mkstemp(buf);
    if (fd < 0)
        return -1;
    (void)close(fd);
    return 0;
}
