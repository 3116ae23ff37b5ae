#!/usr/bin/env bash
# The cost of Python frames: tests/bench/workload_python.py under Debian's python3 (a
# CPython 3.11, whose frames are captured at every sample) recorded at interval 4096, to
# the same run unprofiled. Five rounds, each running all three (order alternating);
# medians of the wall times (three rounds on a shared 2-core machine gave 1.2x to 1.8x for
# one build). Printed as `bench: app_python_ratio_4k <ratio> x` (malloc's heap
# only) and `bench: app_python_ratio_4k_pymalloc_heap <ratio> x` (the default heaps:
# malloc's and python.objects, the objects pymalloc serves). Run by
# `scripts/bench.sh app_python` (HEAPPROF_BUILD: the release build).
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${HEAPPROF_BUILD:-build-release}
heapprof="$build/cli/heapprof"
py=/usr/bin/python3
work=(tests/bench/workload_python.py 300000)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# run KIND: the wall time in ms of one run, into `ms`.
run() {
    local t0 t1
    t0=$EPOCHREALTIME
    if [ "$1" = plain ]; then
        "$py" "${work[@]}" >"$tmp/out.$1"
    elif [ "$1" = prof ]; then
        "$heapprof" record -q -i 4096 --heaps libc.malloc -o "$tmp/t.pftrace" -- \
            "$py" "${work[@]}" >"$tmp/out.$1"
    else
        "$heapprof" record -q -i 4096 -o "$tmp/t.pftrace" -- "$py" "${work[@]}" >"$tmp/out.$1"
    fi
    t1=$EPOCHREALTIME
    ms=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.3f", (b - a) * 1000 }')
    cmp -s "$tmp/out.plain" "$tmp/out.$1" || { echo "bench_app_python: output differs" >&2; exit 1; }
}

plain=() prof=() pyheap=()
for r in 1 2 3 4 5; do
    if [ $((r % 2)) -eq 1 ]; then
        run plain; plain+=("$ms"); run prof; prof+=("$ms"); run pyheap; pyheap+=("$ms")
    else
        run pyheap; pyheap+=("$ms"); run prof; prof+=("$ms"); run plain; plain+=("$ms")
    fi
done
median() { printf '%s\n' "$@" | sort -n | sed -n 3p; }
p=$(median "${plain[@]}") q=$(median "${prof[@]}") h=$(median "${pyheap[@]}")
echo "bench: app_python_plain_wall_ms $(printf '%.0f' "$p") ms"
echo "bench: app_python_ratio_4k $(awk -v a="$q" -v b="$p" 'BEGIN { printf "%.3f", a / b }') x"
echo "bench: app_python_ratio_4k_pymalloc_heap $(awk -v a="$h" -v b="$p" 'BEGIN { printf "%.3f", a / b }') x"
