/* tests/report/pprof_tool.c: `pprof_tool TRACE OUT [DUMP [PID]]` runs
 * rp_pprof_export() as `heapprof pprof` does, for tests/report/check_pprof.py. */
#include <stdlib.h>
#include <string.h>

#include "report/report.h"

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: %s TRACE OUT [DUMP [PID]]\n", argv[0]);
        return 2;
    }
    int dump = argc > 3 ? atoi(argv[3]) : 0;
    int pid = argc > 4 ? atoi(argv[4]) : 0;
    int r = rp_pprof_export(argv[1], argv[2], dump, pid, stdout, NULL);
    if (r < 0) {
        fprintf(stderr, "export failed: %s\n", strerror(-r));
        return 1;
    }
    return 0;
}
