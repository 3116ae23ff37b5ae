/* cli/summary.c: the summary printed on stderr when a session ends. */
#include "cli/cli.h"

#include <stdio.h>
#include <string.h>

#include "common/format.h"
#include "report/report.h"

void cli_print_summary(const char *out_path, const struct svc_summary *sum, int top)
{
    char hb[32];
    hp_format_bytes(sum->output_bytes, hb, sizeof(hb));
    char audit[160] = "";
    if (sum->audit_mismatches)
        snprintf(audit, sizeof(audit), "; %llu of %llu audited stack walks differed",
                 (unsigned long long)sum->audit_mismatches, (unsigned long long)sum->audits);
    if (sum->truncated_stacks) {
        size_t o = strlen(audit);
        snprintf(audit + o, sizeof(audit) - o, "; %llu stacks truncated (deeper than copied)",
                 (unsigned long long)sum->truncated_stacks);
    }
    fprintf(stderr,
            "\nheapprof: %llu process%s, %llu samples (%llu walked in the app, %llu walks "
            "audited), %llu frees recorded; %llu samples dropped, %llu unwinding errors%s%s\n",
            (unsigned long long)sum->processes, sum->processes == 1 ? "" : "es",
            (unsigned long long)sum->samples, (unsigned long long)sum->walked_samples,
            (unsigned long long)sum->audits, (unsigned long long)sum->frees,
            (unsigned long long)sum->records_dropped, (unsigned long long)sum->unwinding_errors,
            audit, sum->corrupt_clients ? "; a client sent corrupt data" : "");
    if (top > 0) {
        struct rp_trace *t;
        if (rp_trace_load(out_path, &(struct rp_trace_options){0}, &t) == 0) {
            rp_report_print(stderr, t,
                            &(struct rp_report_options){
                                .top_n = top, .demangle = true, .unreleased_only = true});
            rp_trace_free(t);
        }
    }
    fprintf(stderr,
            "heapprof: trace written to %s (%s); view it with 'heapprof report %s' or at "
            "ui.perfetto.dev\n",
            out_path, hb, out_path);
}
