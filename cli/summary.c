/* cli/summary.c: the summary printed on stderr when a session ends. */
#include "cli/cli.h"

#include <stdio.h>
#include <string.h>

#include "common/format.h"
#include "report/report.h"

/* Up to this many processes, each gets its top sites in the summary. */
#define SUMMARY_FULL_PROCESSES 3
/* Beyond, a table, and the top sites of this many processes. */
#define SUMMARY_LARGEST 3

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
    /* Every record lost on its way, whatever the cause; the causes below. */
    uint64_t lost = sum->records_dropped + sum->reserve_failures + sum->records_unread +
                    sum->records_lost_service + sum->records_refused + sum->records_no_process;
    fprintf(stderr,
            "\nheapprof: %llu process%s, %llu samples (%llu walked in the app, %llu walks "
            "audited), %llu frees recorded; %llu samples dropped, %llu unwinding errors%s%s\n",
            (unsigned long long)sum->processes, sum->processes == 1 ? "" : "es",
            (unsigned long long)sum->samples, (unsigned long long)sum->walked_samples,
            (unsigned long long)sum->audits, (unsigned long long)sum->frees,
            (unsigned long long)lost, (unsigned long long)sum->unwinding_errors, audit,
            sum->corrupt_clients ? "; a client sent corrupt data" : "");
    if (lost != sum->records_dropped)
        fprintf(stderr,
                "heapprof: records lost: %llu for want of room in the shared buffer, %llu to "
                "contention on it, %llu left unread when sessions ended, %llu for want of "
                "memory in the service, %llu refused by the bookkeeping\n",
                (unsigned long long)sum->records_dropped, (unsigned long long)sum->reserve_failures,
                (unsigned long long)sum->records_unread,
                (unsigned long long)sum->records_lost_service,
                (unsigned long long)(sum->records_refused + sum->records_no_process));
    if (sum->clients_timed_out)
        fprintf(stderr,
                "heapprof: %llu process%s waited longer than the block timeout for the service "
                "and stopped waiting until it caught up (or for good, when it stayed stopped): "
                "samples dropped meanwhile (CLIENT_ERROR_HIT_TIMEOUT)\n",
                (unsigned long long)sum->clients_timed_out,
                sum->clients_timed_out == 1 ? "" : "es");
    if (sum->python_frames || sum->python_unnamed || sum->python_mismatches)
        fprintf(stderr,
                "heapprof: %llu Python frames named, %llu unnamed (<python frame>); %llu stacks "
                "kept without their Python frames (they did not pair with the interpreter's)\n",
                (unsigned long long)sum->python_frames, (unsigned long long)sum->python_unnamed,
                (unsigned long long)sum->python_mismatches);
    if (sum->python_codes_rejected)
        fprintf(stderr,
                "heapprof: %llu names of Python code objects sent by clients were malformed "
                "and ignored (their frames were named from the processes' memory)\n",
                (unsigned long long)sum->python_codes_rejected);
    if (sum->frees_lost)
        fprintf(stderr,
                "heapprof: %llu frees of sampled allocations could not be recorded; the "
                "allocations live then are shown as possibly freed, not as unreleased\n",
                (unsigned long long)sum->frees_lost);
    if (sum->unseen_call_slots)
        fprintf(stderr,
                "heapprof: %llu call slot%s of the allocator in the program could not be "
                "switched to the profiler (unseen_call_slots): the calls through them are "
                "missing from the profile\n",
                (unsigned long long)sum->unseen_call_slots, sum->unseen_call_slots == 1 ? "" : "s");
    if (sum->conn_closed)
        fprintf(stderr,
                "heapprof: %llu process%s closed the profiler's connection while running "
                "(e.g. closefrom or close_range at start): not profiled from there on\n",
                (unsigned long long)sum->conn_closed, sum->conn_closed == 1 ? "" : "es");
    if (sum->forks_unfollowed)
        fprintf(stderr, "heapprof: %llu process%s forked from targets %s not followed (%s)\n",
                (unsigned long long)sum->forks_unfollowed, sum->forks_unfollowed == 1 ? "" : "es",
                sum->forks_unfollowed == 1 ? "was" : "were",
                sum->fork_hint ? sum->fork_hint : "use --follow-fork");
    if (sum->stall_waits || sum->stall_skips || sum->stall_cutoffs)
        fprintf(stderr,
                "heapprof: writers stalled in the middle of a record: %llu time%s stopped "
                "(debugger, SIGSTOP, freezer; waited for), %llu record%s of exited threads "
                "skipped, %llu process%s cut off (a running thread kept a record)\n",
                (unsigned long long)sum->stall_waits, sum->stall_waits == 1 ? "" : "s",
                (unsigned long long)sum->stall_skips, sum->stall_skips == 1 ? "" : "s",
                (unsigned long long)sum->stall_cutoffs, sum->stall_cutoffs == 1 ? "" : "es");
    if (top > 0) {
        struct rp_trace *t = NULL;
        /* As `heapprof report` shows them: wrappers folded, no frames below main. */
        rp_filter_t *f = rp_filter_new(NULL, NULL, 0);
        if (rp_trace_load(out_path, &(struct rp_trace_options){0}, &t) == 0 &&
            (!f || rp_trace_filter(t, f) == 0)) {
            struct rp_report_options ro = {
                .top_n = top, .demangle = true, .unreleased_only = true, .no_stacks = false};
            size_t dumped = 0;
            for (size_t i = 0; i < t->n_processes; i++)
                dumped += t->processes[i].selected;
            /* Many processes (a build, a shell script): one line each, and the sites of
             * the few that hold the most, so the summary stays a screen long. */
            if (dumped > SUMMARY_FULL_PROCESSES)
                rp_report_print_summary(stderr, t, &ro, SUMMARY_LARGEST);
            else
                rp_report_print(stderr, t, &ro);
        }
        rp_trace_free(t);
        rp_filter_free(f);
    }
    fprintf(stderr,
            "heapprof: trace written to %s (%s); view it with 'heapprof report %s' or at "
            "ui.perfetto.dev\n",
            out_path, hb, out_path);
}
