#!/usr/bin/env bash
# What a host's other processes cost `heapprof record`: the wall time of a short recorded
# program (tests/bench/churn 1 1, --no-source-lines so that debug information does not
# weigh in) with IDLE_PROCS sleeping processes on the machine that are none of record's,
# against the same with none of them, alternately over ROUNDS rounds. record names the
# processes it leaves running when it ends, and finding them must cost what its own
# descendants are, not what the host runs. Run by `scripts/bench.sh record` (which
# builds build-release and sets HEAPPROF_BUILD). Prints, from medians over the rounds:
#   bench: record_busy_host_extra_ms <ms> ms   the time IDLE_PROCS others add
#
# Environment: BENCH_RECORD_ROUNDS (default 7), BENCH_RECORD_IDLE_PROCS (default 2000),
# HEAPPROF_BUILD (default build-release).
set -euo pipefail
cd "$(dirname "$0")/../.."

build=${HEAPPROF_BUILD:-$PWD/build-release}
rounds=${BENCH_RECORD_ROUNDS:-7}
idle=${BENCH_RECORD_IDLE_PROCS:-2000}
heapprof="$build/cli/heapprof"
churn="$build/tests/bench/churn"
for f in "$heapprof" "$churn"; do
    [ -x "$f" ] || { echo "bench_record_host: $f missing (build first)" >&2; exit 1; }
done
tmp=$(mktemp -d /tmp/heapprof-bench-record.XXXXXX)
sleepers=()
cleanup() {
    [ ${#sleepers[@]} -eq 0 ] || kill "${sleepers[@]}" 2>/dev/null || true
    wait 2>/dev/null || true
    rm -rf "$tmp"
}
trap cleanup EXIT

# One recorded run's wall time in ms.
one() {
    local s e
    s=$(date +%s%N)
    "$heapprof" record -q --no-source-lines -o "$tmp/t.pftrace" -- "$churn" 1 1 >/dev/null
    e=$(date +%s%N)
    echo $(((e - s) / 1000000))
}

quiet=()
busy=()
for ((r = 0; r < rounds; r++)); do
    quiet+=("$(one)")
    for ((i = 0; i < idle; i++)); do
        sleep 600 &
        sleepers+=($!)
    done
    busy+=("$(one)")
    kill "${sleepers[@]}" 2>/dev/null || true
    wait "${sleepers[@]}" 2>/dev/null || true
    sleepers=()
done
median() { printf '%s\n' "$@" | sort -n | awk '{a[NR] = $1} END {print a[int((NR + 1) / 2)]}'; }
q=$(median "${quiet[@]}")
b=$(median "${busy[@]}")
echo "# record_busy_host: median ${q} ms alone, ${b} ms beside ${idle} idle processes" >&2
echo "bench: record_busy_host_extra_ms $((b - q)) ms"
