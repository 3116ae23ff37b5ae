/* cli/heapprof.c: the `heapprof` command: dispatches to its subcommands.
 *
 *     heapprof record [options] -- CMD [ARGS...]   profile CMD from its first allocation
 *     heapprof attach -p PID | -n NAME [options]   profile running processes
 *     heapprof dump                                ask heapprofd to dump now
 *     heapprof report FILE [--top N]               print the top allocation sites
 *     heapprof pprof FILE [-o OUT]                 export the dumps as gzipped pprof
 *     heapprof html FILE [-o OUT]                  the trace as a self-contained HTML page
 */
#include "cli/cli.h"

#include <stdio.h>
#include <string.h>

static void usage_main(FILE *f)
{
    fputs("usage: heapprof COMMAND [ARGS...]\n"
          "\n"
          "A sampling heap profiler. Commands:\n"
          "  record [options] -- CMD [ARGS...]  run CMD under the profiler, write a trace\n"
          "  report FILE [options]              print the top allocation sites of a trace\n"
          "  attach -p PID | -n NAME [options]  profile running processes that have\n"
          "                                     libheapprof.so preloaded\n"
          "  dump [DAEMON_PID]                  ask the running heapprofd to dump now\n"
          "  pprof FILE [options]               export the dumps of a trace as pprof files\n"
          "  html FILE [options]                write a trace as one HTML page (flame graphs)\n"
          "\n"
          "Run 'heapprof COMMAND --help' for the options of a command.\n",
          f);
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        usage_main(stderr);
        return EXIT_USAGE;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "-h") || !strcmp(cmd, "--help") || !strcmp(cmd, "help")) {
        usage_main(stdout);
        return 0;
    }
    if (!strcmp(cmd, "--version")) {
        printf("heapprof %s\n", HP_VERSION);
        return 0;
    }
    if (!strcmp(cmd, "record"))
        return cmd_record(argc - 1, argv + 1);
    if (!strcmp(cmd, "report"))
        return cmd_report(argc - 1, argv + 1);
    if (!strcmp(cmd, "attach"))
        return cmd_attach(argc - 1, argv + 1);
    if (!strcmp(cmd, "dump"))
        return cmd_dump(argc - 1, argv + 1);
    if (!strcmp(cmd, "pprof"))
        return cmd_pprof(argc - 1, argv + 1);
    if (!strcmp(cmd, "html"))
        return cmd_html(argc - 1, argv + 1);
    fprintf(stderr, "heapprof: unknown command '%s'\n", cmd);
    usage_main(stderr);
    return EXIT_USAGE;
}
