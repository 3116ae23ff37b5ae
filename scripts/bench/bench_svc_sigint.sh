#!/usr/bin/env bash
# How soon heapprofd stops after SIGINT while a client writes flat out. Run by
# `scripts/bench.sh svc` (which builds build-release and sets HEAPPROF_BUILD).
#
# One run: heapprofd (--all, its own socket and trace in a temporary directory) is
# started and waited for; tests/programs/hostile_client mapsflood makes 20 000 mappings
# (alternate protections, so none merge), prints "ready", then writes pairs of
# WIRE_MAPS_CHANGED and one-pc WIRE_ALLOC_PCS records flat out without ever hanging up.
# One second after "ready" heapprofd gets SIGINT; the time is from the signal to its exit
# (every session ended, the final dump written), the client still writing. The client
# is killed afterwards.
#   svc_sigint_to_exit_ms  the median over ROUNDS runs (goal <= 1000, issue 16)
#
# Environment: BENCH_SVC_ROUNDS (default 3), HEAPPROF_BUILD (default build-release),
# BENCH_SVC_DAEMON (the heapprofd to measure, default the build's).
set -euo pipefail
cd "$(dirname "$0")/../.."

. scripts/bench/svc_setup.sh bench_svc_sigint 3

# run_one: adds the milliseconds from SIGINT to heapprofd's exit to ms (not run in a
# subshell, so that the EXIT trap sees the processes it started).
ms=()
run_one() {
    local sock="$tmp/s.sock"
    rm -f "$tmp/client.out"
    svc_start_daemon
    local pid=$daemon_pid
    # At most 60 s of writing: killed long before.
    "$client" "$sock" mapsflood 1 60 >"$tmp/client.out" 2>"$tmp/client.log" &
    local cpid=$!
    pids+=("$cpid")
    for _ in $(seq 1000); do
        grep -q ready "$tmp/client.out" 2>/dev/null && break
        sleep 0.01
    done
    grep -q ready "$tmp/client.out" || svc_fail "hostile_client mapsflood not ready" "$tmp/client.log"
    sleep 1
    kill -0 "$cpid" || svc_fail "hostile_client ended early" "$tmp/client.log"
    local t0 t1
    t0=$(now_ns)
    kill -INT "$pid"
    wait "$pid" || svc_fail "heapprofd failed" "$tmp/daemon.log"
    t1=$(now_ns)
    kill -KILL "$cpid" 2>/dev/null || true
    wait "$cpid" 2>/dev/null || true
    ms+=($(((t1 - t0) / 1000000)))
}

for _ in $(seq "$rounds"); do
    run_one
done
echo "# SIGINT to exit with a client of 20 000 mappings writing flat out, ms: ${ms[*]}"
echo "bench: svc_sigint_to_exit_ms $(printf '%s\n' "${ms[@]}" | median) ms"
