/* tests/fuzz/fuzz_trace_reader.c: the streaming trace reader on arbitrary bytes, then
 * the report (its summary too), the diff, the folded stacks and the pprof encoder on
 * whatever it accepted, before and after the stack filter. Any input must end in a
 * clean error or a consistent trace; sanitizers catch the rest. */
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <unistd.h>

#include "report/report.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct rp_trace *t;
    /* The first byte picks a dump number, as `heapprof report --dump N` would, and
     * whether every dump is kept (`--growth`, `heapprof pprof`). */
    int dump = size ? data[0] % 4 : 0;
    bool all = size && (data[0] & 4);
    if (rp_trace_load_buffer(
            data, size, &(struct rp_trace_options){.dump_index = dump, .all_dumps = all}, &t) < 0)
        return 0;
    FILE *devnull = fopen("/dev/null", "we");
    if (devnull) {
        rp_report_print(devnull, t, &(struct rp_report_options){.top_n = 3, .demangle = true});
        rp_report_print_diff(devnull, t, t, &(struct rp_report_options){.top_n = 3});
        rp_report_print_summary(devnull, t, &(struct rp_report_options){.top_n = 2}, 2);
        if (all)
            rp_report_print_growth(devnull, t, &(struct rp_report_options){.top_n = 3});
        /* As `heapprof report` runs: filtered (bit 3 of the first byte: with --hide,
         * --focus and --no-fold too), then the summary first and the folded stacks. */
        const char *hide[] = {"^m"}, *focus[] = {"a|^$|unknown"};
        bool pats = size && (data[0] & 8);
        rp_filter_t *f = rp_filter_new(
            &(struct rp_filter_options){
                .hide = hide, .n_hide = pats, .focus = focus, .n_focus = pats, .no_fold = pats},
            NULL, 0);
        if (f && rp_trace_filter(t, f) == 0) {
            rp_report_print(devnull, t,
                            &(struct rp_report_options){
                                .top_n = 3, .demangle = true, .summary = true, .max_processes = 2});
            for (int v = RP_FOLDED_UNRELEASED; v <= RP_FOLDED_ALLOCATED_COUNT; v++) {
                int r = rp_report_print_folded(devnull, t, (enum rp_folded_value)v, NULL);
                if (r < 0 && r != -ENOMEM)
                    __builtin_trap(); /* it fails only for lack of memory */
            }
        }
        rp_filter_free(f);
        fclose(devnull);
    }
    int fd = open("/dev/null", O_WRONLY | O_CLOEXEC);
    for (size_t i = 0; fd >= 0 && i < t->n_processes && i < 4; i++) {
        const struct rp_trace_process *p = &t->processes[i];
        int r = rp_pprof_write(t, p, fd);
        for (uint32_t k = 0; r == 0 && p->dumps && k < p->n_dumps && k < 4; k++)
            r = rp_pprof_write_dump(p, &p->dumps[k], fd);
        if (r < 0 && r != -ENOMEM)
            __builtin_trap(); /* writing to /dev/null fails only for lack of memory */
    }
    if (fd >= 0)
        close(fd);
    rp_trace_free(t);
    return 0;
}
