#!/usr/bin/env bash
# node under the profilers: tests/bench/workload_node.js (Maps of Buffers, a rolling
# window of 64 KiB Buffers, hashed; most stacks cross V8's JIT code) unprofiled, under
# `heapprof record` at the default interval (4 KiB) and under heaptrack, round robin
# over ROUNDS rounds. Run by `scripts/bench.sh node` (which builds build-release and sets
# HEAPPROF_BUILD). Prints, from medians over the rounds:
#   bench: app_node_ratio_4k <ratio> x            wall time under record / unprofiled
#                                                 (goal <= 1.5, and below heaptrack's)
#   bench: app_node_heaptrack_ratio <ratio> x     the same for heaptrack
#   bench: node_walked_share <share> fraction     samples whose stack the program walked
#                                                 itself (record's summary; goal >= 0.9)
#   bench: node_dropped_samples <n> samples       samples record dropped
# Every profiled run must print the unprofiled output. A missed goal is reported, not a
# failure. Environment: BENCH_NODE_ROUNDS (default 3), BENCH_NODE_SCALE (workload size,
# default 6: about 1.5 s unprofiled), HEAPPROF_BUILD (default build-release).
set -euo pipefail
cd "$(dirname "$0")/../.."

build=${HEAPPROF_BUILD:-$PWD/build-release}
rounds=${BENCH_NODE_ROUNDS:-3}
scale=${BENCH_NODE_SCALE:-6}
heapprof="$build/cli/heapprof"
workload="$PWD/tests/bench/workload_node.js"
for p in /usr/bin/node heaptrack "$heapprof"; do
    command -v "$p" >/dev/null || { echo "bench_node: $p not found" >&2; exit 1; }
done

tmp=$(mktemp -d /tmp/heapprof-bench-node.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
cd "$tmp"

now_ms() { date +%s%3N; }
median() { sort -g | awk '{v[NR] = $1} END {print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }

want=$(/usr/bin/node "$workload" "$scale")
run() { # tool: appends the wall ms to $tmp/<tool>.ms
    local tool=$1 t0 t1 out
    t0=$(now_ms)
    case $tool in
    plain) out=$(/usr/bin/node "$workload" "$scale") ;;
    heapprof4k) out=$("$heapprof" record -o "$tmp/t.pftrace" -- /usr/bin/node "$workload" "$scale" 2>"$tmp/err") ;;
    heaptrack) out=$(heaptrack -o "$tmp/ht" /usr/bin/node "$workload" "$scale" 2>/dev/null | grep -E '^[0-9]+ [0-9a-f]{64}$' || true) ;;
    esac
    t1=$(now_ms)
    if [ "$out" != "$want" ]; then
        echo "bench_node: $tool changed the output: $out" >&2
        exit 1
    fi
    echo $((t1 - t0)) >>"$tmp/$tool.ms"
    if [ "$tool" = heapprof4k ]; then
        sed -n 's/^heapprof: 1 process, \([0-9]*\) samples (\([0-9]*\) walked.*; \([0-9]*\) samples dropped.*/\1 \2 \3/p' \
            "$tmp/err" >>"$tmp/summary"
    fi
    rm -f "$tmp"/ht* "$tmp/t.pftrace"
}

tools=(plain heapprof4k heaptrack)
for ((r = 0; r < rounds; r++)); do
    for ((k = 0; k < ${#tools[@]}; k++)); do
        run "${tools[$(((k + r) % ${#tools[@]}))]}"
    done
done

plain=$(median <"$tmp/plain.ms")
hp=$(median <"$tmp/heapprof4k.ms")
ht=$(median <"$tmp/heaptrack.ms")
share=$(awk '{print $2 / $1}' "$tmp/summary" | median)
dropped=$(awk '{print $3}' "$tmp/summary" | median)
echo "bench: app_node_plain_wall_ms $plain ms"
echo "bench: app_node_ratio_4k $(awk -v a="$hp" -v b="$plain" 'BEGIN {printf "%.2f", a / b}') x"
echo "bench: app_node_heaptrack_ratio $(awk -v a="$ht" -v b="$plain" 'BEGIN {printf "%.2f", a / b}') x"
echo "bench: node_walked_share $(awk -v s="$share" 'BEGIN {printf "%.3f", s}') fraction"
echo "bench: node_dropped_samples $dropped samples"
