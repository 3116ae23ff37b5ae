#!/usr/bin/env bash
# Hash flooding, end to end: how much longer the service takes over allocation records
# whose addresses were crafted to collide in its tables than over random ones. Run by
# `scripts/bench.sh svc` (which builds build-release and sets HEAPPROF_BUILD).
#
# One run: heapprofd (--all, its own socket and trace in a temporary directory) is
# started and waited for; then tests/programs/hostile_client writes COUNT allocation
# records (waiting for room in the ring, none dropped) and leaves; heapprofd gets SIGINT
# and is waited for. The time is from the client's start to heapprofd's exit: every record
# unwound and applied by the bookkeeping thread, the final dump written.
#   randflood  random addresses (the baseline)
#   hashflood  addresses unhash(i << 32): every one lands in slot 0 under the unkeyed
#              splitmix64 finalizer the tables used to hash with; against a keyed hash
#              it is what an attacker who does not know the secret can do
# Runs alternate between the two, ROUNDS of each; figures are medians:
#   svc_flood_vs_random_ratio  hashflood time / randflood time (goal <= 2)
#   svc_flood_ms, svc_random_ms  the medians themselves
#
# Environment: BENCH_SVC_ROUNDS (default 5), BENCH_SVC_RECORDS (default 200000),
# HEAPPROF_BUILD (default build-release), BENCH_SVC_DAEMON (the heapprofd to measure,
# default the build's: another build's, to compare before and after a change).
set -euo pipefail
cd "$(dirname "$0")/../.."

. scripts/bench/svc_setup.sh bench_svc_flood 5
count=${BENCH_SVC_RECORDS:-200000}

# run_one MODE: prints the milliseconds from the client's start to the daemon's exit.
run_one() {
    local mode=$1 sock="$tmp/s.sock"
    svc_start_daemon
    local pid=$daemon_pid
    # A command substitution's subshell runs no EXIT trap of its parent's.
    trap 'kill "$pid" 2>/dev/null' EXIT
    local t0 t1
    t0=$(now_ns)
    "$client" "$sock" "$mode" 1 "$count" >/dev/null 2>"$tmp/client.log" ||
        svc_fail "hostile_client $mode failed" "$tmp/client.log"
    kill -INT "$pid"
    wait "$pid" || svc_fail "heapprofd failed" "$tmp/daemon.log"
    t1=$(now_ns)
    trap - EXIT
    grep -q "$count samples" "$tmp/daemon.log" ||
        svc_fail "not every record was processed" "$tmp/daemon.log"
    echo $(((t1 - t0) / 1000000))
}

rand_ms=() flood_ms=()
for r in $(seq "$rounds"); do
    if [ $((r % 2)) -eq 1 ]; then
        rand_ms+=("$(run_one randflood)")
        flood_ms+=("$(run_one hashflood)")
    else
        flood_ms+=("$(run_one hashflood)")
        rand_ms+=("$(run_one randflood)")
    fi
done
echo "# $count records per run; randflood ms: ${rand_ms[*]}; hashflood ms: ${flood_ms[*]}"
rm_=$(printf '%s\n' "${rand_ms[@]}" | median)
fm_=$(printf '%s\n' "${flood_ms[@]}" | median)
echo "bench: svc_random_ms $rm_ ms"
echo "bench: svc_flood_ms $fm_ ms"
awk -v f="$fm_" -v r="$rm_" 'BEGIN {printf "bench: svc_flood_vs_random_ratio %.2f ratio\n", f / (r > 0 ? r : 1)}'
