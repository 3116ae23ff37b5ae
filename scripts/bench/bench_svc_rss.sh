#!/usr/bin/env bash
# The service's memory under the worst client we have: its peak RSS with a client that
# makes it keep ever more. Run by `scripts/bench.sh svc` (which builds build-release and
# sets HEAPPROF_BUILD).
#
# One run: heapprofd (--all, its own socket and trace in a temporary directory) with the
# memory guardrail max_heapprofd_memory_kb=262144 (--max-memory-kb; the service setting
# this bench states) is started and waited for; tests/programs/hostile_client memhog
# writes allocation records at new addresses with new random 16-frame stacks as fast as
# the service takes them (every live allocation, frame and callstack is new: all the
# service keeps of a process grows), for at most 20 s. The guardrail detaches it (and
# every session) long before; once it has exited, heapprofd's peak RSS (VmHWM, rings
# and the dump that follows the guardrail included) is read, and it gets SIGINT.
#   svc_rss_mb_hostile  the largest VmHWM over ROUNDS runs, in MB (2^20 bytes); the bound
#                       is the guardrail: 256 MB (without it the service grows without
#                       limit, ~800 MB in 5 s)
#
# Environment: BENCH_SVC_ROUNDS (default 3), BENCH_SVC_MEMORY_KB (default 262144),
# HEAPPROF_BUILD (default build-release), BENCH_SVC_DAEMON (the heapprofd to measure,
# default the build's).
set -euo pipefail
cd "$(dirname "$0")/../.."

. scripts/bench/svc_setup.sh bench_svc_rss 3
limit_kb=${BENCH_SVC_MEMORY_KB:-262144}

# run_one: adds heapprofd's peak RSS in KiB to kb (not run in a subshell, so that the
# EXIT trap sees the processes it started).
kb=()
run_one() {
    local sock="$tmp/s.sock"
    svc_start_daemon --max-memory-kb "$limit_kb"
    local pid=$daemon_pid
    "$client" "$sock" memhog 1 20 >/dev/null 2>"$tmp/client.log" ||
        svc_fail "hostile_client memhog failed" "$tmp/client.log"
    local hwm
    hwm=$(awk '/^VmHWM:/ {print $2}' "/proc/$pid/status")
    kill -INT "$pid"
    wait "$pid" || svc_fail "heapprofd failed" "$tmp/daemon.log"
    grep -q "guardrail hit" "$tmp/daemon.log" || svc_fail "the guardrail did not fire" "$tmp/daemon.log"
    kb+=("$hwm")
}

for _ in $(seq "$rounds"); do
    run_one
done
echo "# heapprofd peak RSS under memhog, KiB: ${kb[*]} (guardrail $limit_kb KiB)"
printf '%s\n' "${kb[@]}" | sort -n | tail -1 |
    awk '{printf "bench: svc_rss_mb_hostile %.1f MB\n", $1 / 1024}'
