/* tests/producer/fake_traced_main.c: `fake_traced --socket PATH [--smb-kb N]
 * [--page-kb N] [--shuffle-methods] [--stop-timeout-ms N]`: the fake tracing service
 * (fake_traced.h) as a process, for end-to-end tests that run heapprofd --producer
 * against it (and kill it). Commands on stdin, one per line; every command answers one
 * line on stdout:
 *
 *   wait-producer MS              -> "producer ok" | "producer timeout"
 *   start HEX OUTPUT              -> "session N" (HEX: HeapprofdConfig bytes)
 *   flush N                       -> "flush N ok" | "flush N failed"
 *   clear N                       -> "clear N"
 *   stop N                        -> "stop N ok" | "stop N timeout" (trace written)
 *   stall on|off                  -> "stall on|off"
 *   drop-producer                 -> "dropped"
 *   stats                         -> "stats name=value ... violations=V"
 *   quit                          -> "bye"
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/producer/fake_traced.h"

static void put_stat(void *ctx, const char *line)
{
    (void)ctx;
    printf(" %s", line);
}

static int hexval(int c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    return -1;
}

int main(int argc, char **argv)
{
    struct ft_options o = {0};
    static const struct option opts[] = {
        {"socket", required_argument, NULL, 's'},
        {"smb-kb", required_argument, NULL, 'm'},
        {"page-kb", required_argument, NULL, 'p'},
        {"shuffle-methods", no_argument, NULL, 'x'},
        {"stop-timeout-ms", required_argument, NULL, 't'},
        {0},
    };
    int c;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (c) {
        case 's':
            o.socket_path = optarg;
            break;
        case 'm':
            o.smb_size_bytes = (uint32_t)strtoul(optarg, NULL, 10) * 1024;
            break;
        case 'p':
            o.page_size_bytes = (uint32_t)strtoul(optarg, NULL, 10) * 1024;
            break;
        case 'x':
            o.shuffle_methods = true;
            break;
        case 't':
            o.stop_timeout_ms = (uint32_t)strtoul(optarg, NULL, 10);
            break;
        default:
            return 2;
        }
    }
    if (!o.socket_path) {
        fprintf(stderr, "fake_traced: --socket PATH required\n");
        return 2;
    }
    ft_t *ft;
    if (ft_new(&o, &ft) < 0) {
        perror("fake_traced");
        return 1;
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    printf("listening %s\n", o.socket_path);
    char line[65536];
    while (fgets(line, sizeof(line), stdin)) {
        line[strcspn(line, "\n")] = '\0';
        char *cmd = strtok(line, " "), *a1 = strtok(NULL, " "), *a2 = strtok(NULL, " ");
        if (!cmd)
            continue;
        int n = a1 ? atoi(a1) : 0;
        if (!strcmp(cmd, "wait-producer")) {
            printf("producer %s\n", ft_wait_producer(ft, n) ? "ok" : "timeout");
        } else if (!strcmp(cmd, "start") && a1 && a2) {
            size_t len = strlen(a1) / 2;
            uint8_t *cfg = malloc(len + 1);
            for (size_t i = 0; i < len; i++)
                cfg[i] = (uint8_t)(hexval(a1[2 * i]) << 4 | hexval(a1[2 * i + 1]));
            if (!strcmp(a1, "-"))
                len = 0;
            int s = ft_start_session(ft, &(struct ft_session_config){.heapprofd_config = cfg,
                                                                     .heapprofd_config_len = len,
                                                                     .output = a2});
            free(cfg);
            printf("session %d\n", s);
        } else if (!strcmp(cmd, "flush")) {
            printf("flush %d %s\n", n, ft_flush(ft, n, 5000) ? "ok" : "failed");
        } else if (!strcmp(cmd, "clear")) {
            ft_clear_incremental_state(ft, n);
            printf("clear %d\n", n);
        } else if (!strcmp(cmd, "stop")) {
            printf("stop %d %s\n", n, ft_stop_session(ft, n) ? "ok" : "timeout");
        } else if (!strcmp(cmd, "stall") && a1) {
            ft_stall_commits(ft, !strcmp(a1, "on"));
            printf("stall %s\n", a1);
        } else if (!strcmp(cmd, "drop-producer")) {
            ft_drop_producer(ft);
            printf("dropped\n");
        } else if (!strcmp(cmd, "stats")) {
            struct ft_stats st;
            ft_get_stats(ft, &st);
            printf("stats");
            ft_print_stats(&st, put_stat, NULL);
            printf(" violations=%llu\n", (unsigned long long)ft_violations(&st));
        } else if (!strcmp(cmd, "quit")) {
            printf("bye\n");
            break;
        } else {
            printf("error unknown command\n");
        }
    }
    ft_free(ft);
    return 0;
}
