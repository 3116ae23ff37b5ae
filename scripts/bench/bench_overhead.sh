#!/usr/bin/env bash
# Overhead side by side: the same workloads unprofiled, under `heapprof record` at
# sampling intervals 4096 and 524288 and in exact mode (interval 1), and under heaptrack. Run by `scripts/bench.sh
# overhead` (which builds build-release and sets HEAPPROF_BUILD).
#
# Workloads (each ~0.3-1 s unprofiled on an idle 2-core machine):
#   churn1t  tests/bench/churn.c, 1 thread: malloc/free of 16..271 bytes in a tight loop
#   churn2t  the same with 2 threads
#   stl      tests/bench/stl_churn.cpp: std::string, std::map, std::unordered_map, sort
#   python   /usr/bin/python3 tests/bench/workload_python.py: dicts, lists, str (Debian's
#            python3 by path: a python3 found on PATH may be a wrapper script)
#   sqlite   /usr/bin/sqlite3 :memory: tests/bench/workload_sqlite.sql: 200k rows inserted by a
#            recursive CTE, two indexes built, queried
#   jq       /usr/bin/jq on generated JSON (60k objects, 8.7 MB, made by python3 at start):
#            group_by, map, add, join, unique
#   empty    /bin/true: the profilers' fixed start and stop costs; reported as
#            overhead_empty_<tool>_extra_wall_ms (the wall time added) instead of ratios
# Tools: plain (unprofiled), heapprof4k (`heapprof record -q -i 4096 -o F --`),
# heapprof512k (`-i 524288`), heapprof1 (`-i 1`: every allocation, exact, as heaptrack
# records), heaptrack (`heaptrack -o F`), producer4k (the program started with the library
# preloaded, profiled at 4096 by a `heapprofd --producer` that runs for the whole
# benchmark as the data source of one tracing session of the test suite's fake traced
# (tests/producer/), with `all: true`; its service is not started per run, so compare
# its program CPU with heapprof4k's: overhead_<w>_producer4k_vs_heapprof4k_cpu_ratio).
#
# Runs are round robin: in each of ROUNDS rounds every workload runs once under every
# tool, the tool order rotating from round to round; figures are medians over rounds.
# Every profiled run must print the unprofiled output (checksums) and exit 0.
#
# What is measured:
#   wall    the whole command, profiler start-up and trace writing included (the time
#           a user waits), from the benchmark's shell
#   rss     the profiled program's own peak RSS (VmHWM at its exit, which counts the
#           profiler's in-process memory: its library, buffers and the shared ring).
#           Both profilers run the program as their child, so /usr/bin/time around them
#           would see the largest process of their tree instead; the program's own figure
#           comes from tests/bench/peak_rss.c (libbench_peak_rss.so), preloaded into
#           every run, which appends "<pid> <comm> <VmHWM KiB>" at each process's exit.
#           /usr/bin/time -f %M of the unprofiled run cross-checks it.
#   cpu     the profiled program's own user+system CPU time (its threads, reported by
#           the same preloaded library): less sensitive than wall time to other load on
#           the machine, but blind to time the program spends waiting (e.g. for space in
#           heapprof's ring); informational, the goals are on wall time
#   tool_rss_kb  the profiler's own processes, separately: the `heapprof record`
#           process (service threads and bookkeeping), or the largest of heaptrack's
#           heaptrack_interpret and compressor; median over rounds
#   tool_cpu_ms  the CPU time of those processes (sum), median over rounds
#   output_bytes  the trace (heapprof) or the compressed heaptrack data file
# Printed as `bench: overhead_<workload>_<tool>_{wall_ratio,cpu_ratio,rss_ratio}` (to
# the unprofiled medians), `..._output_bytes`, `..._tool_rss_kb`, `..._tool_cpu_ms`,
# the unprofiled `overhead_<workload>_plain_{wall_ms,cpu_ms,rss_kb}`, then a Markdown table with the goals
# (heapprof 4k <= 1.10x wall on churn*, <= 1.05x on the others; 512k <= 1.02x; both
# faster than heaptrack; heapprof1 no slower than heaptrack). A missed goal is reported, not a failure (the figures are
# noisy on a shared machine); a failed or wrong run is.
#
# Environment: BENCH_OVERHEAD_ROUNDS (default 5), BENCH_OVERHEAD_WORKLOADS (names,
# default all), BENCH_OVERHEAD_TOOLS (default all; plain is always run),
# BENCH_OVERHEAD_SCALE (multiplies the workload sizes, default 1),
# HEAPPROF_BUILD (default build-release).
set -euo pipefail
cd "$(dirname "$0")/../.."

build=${HEAPPROF_BUILD:-$PWD/build-release}
rounds=${BENCH_OVERHEAD_ROUNDS:-5}
scale=${BENCH_OVERHEAD_SCALE:-1}
heapprof="$build/cli/heapprof"
peaklib="$build/tests/bench/libbench_peak_rss.so"
for f in "$heapprof" "$peaklib" "$build/tests/bench/churn" "$build/tests/bench/stl_churn"; do
    [ -e "$f" ] || { echo "bench_overhead: $f missing (build first)" >&2; exit 1; }
done
for p in heaptrack /usr/bin/time /usr/bin/python3 /usr/bin/sqlite3 /usr/bin/jq timeout; do
    command -v "$p" >/dev/null || { echo "bench_overhead: $p not installed" >&2; exit 1; }
done

read -r -a workloads <<<"${BENCH_OVERHEAD_WORKLOADS:-churn1t churn2t stl python sqlite jq empty}"
read -r -a tools <<<"plain ${BENCH_OVERHEAD_TOOLS:-heapprof4k heapprof512k heapprof1 heaptrack producer4k}"
mapfile -t tools < <(printf '%s\n' "${tools[@]}" | awk '!seen[$0]++')

tmp=$(mktemp -d /tmp/heapprof-bench-overhead.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
sql="$tmp/workload.sql"
sed "s/i < 200000/i < $((200000 * scale))/" tests/bench/workload_sqlite.sql >"$sql"
json="$tmp/workload.json"
jq_query='group_by(.group) | map({g: .[0].group, n: length, s: (map(.value) | add),
  names: (map(.name) | join(",") | length), tags: (map(.tags[]) | unique)})'
if [[ " ${workloads[*]} " == *" jq "* ]]; then
    python3 - "$json" $((60000 * scale)) <<'EOF'
import json, random, sys
random.seed(1)
words = ["alpha", "beta", "gamma", "delta", "eps", "zeta", "eta", "theta", "iota", "kappa"]
with open(sys.argv[1], "w") as f:
    f.write("[")
    for i in range(int(sys.argv[2])):
        o = {"id": i, "name": "item-%d-%s" % (i, random.choice(words)), "group": "g%d" % (i % 97),
             "value": random.randint(0, 10**6), "tags": random.sample(words, 3),
             "nested": {"a": i % 7, "b": [i % 3, i % 5, i % 11]}}
        f.write(("," if i else "") + json.dumps(o))
    f.write("]")
EOF
fi

# producer4k: one fake traced and one heapprofd --producer for all runs.
producer_start() {
    local fake="$build/tests/producer/fake_traced" hex
    [ -x "$fake" ] || { echo "bench_overhead: $fake missing (a build with tests)" >&2; exit 1; }
    coproc FAKE { exec "$fake" --socket "$tmp/traced.sock"; }
    read -r _ <&"${FAKE[0]}"
    PERFETTO_PRODUCER_SOCK_NAME="$tmp/traced.sock" "$build/cli/heapprofd" --producer \
        --socket "$tmp/heapprofd.sock" --no-status 2>"$tmp/heapprofd.log" &
    producer_pid=$!
    echo "wait-producer 10000" >&"${FAKE[1]}"
    read -r line <&"${FAKE[0]}"
    [ "$line" = "producer ok" ] || { echo "bench_overhead: no producer: $line" >&2; exit 1; }
    # HeapprofdConfig: sampling_interval_bytes 4096, all, block_client with a 100 ms
    # timeout (heapprof record's defaults).
    hex=0880202801480170a08d06
    echo "start $hex $tmp/producer.pftrace" >&"${FAKE[1]}"
    read -r line <&"${FAKE[0]}"
    sleep 0.5
}
producer_stop() {
    echo "stop 0" >&"${FAKE[1]}" && read -r _ <&"${FAKE[0]}"
    echo "quit" >&"${FAKE[1]}" && read -r _ <&"${FAKE[0]}"
    kill "$producer_pid" 2>/dev/null && wait "$producer_pid" || true
}

# workload_cmd NAME: the command line, into the array `cmd`.
workload_cmd() {
    case "$1" in
    churn1t) cmd=("$build/tests/bench/churn" $((25000000 * scale)) 1) ;;
    churn2t) cmd=("$build/tests/bench/churn" $((12000000 * scale)) 2) ;;
    stl) cmd=("$build/tests/bench/stl_churn" $((16 * scale))) ;;
    python) cmd=(/usr/bin/python3 tests/bench/workload_python.py $((300000 * scale))) ;;
    sqlite) cmd=(/usr/bin/sqlite3 :memory: ".read $sql") ;;
    jq) cmd=(/usr/bin/jq -c "$jq_query" "$json") ;;
    empty) cmd=(/bin/true) ;;
    *) echo "bench_overhead: unknown workload $1" >&2; exit 1 ;;
    esac
}

# tool_prefix TOOL OUT: the profiler's command line before the program, into `pre`.
tool_prefix() {
    case "$1" in
    plain) pre=() ;;
    heapprof4k) pre=("$heapprof" record -q -i 4096 -o "$2" --) ;;
    heapprof512k) pre=("$heapprof" record -q -i 524288 -o "$2" --) ;;
    heapprof1) pre=("$heapprof" record -q -i 1 -o "$2" --) ;;
    heaptrack) pre=(heaptrack -o "$2") ;;
    producer4k) pre=(env "LD_PRELOAD=$build/preload/libheapprof.so:$peaklib"
        "HEAPPROF_SOCKET=$tmp/heapprofd.sock") ;;
    *) echo "bench_overhead: unknown tool $1" >&2; exit 1 ;;
    esac
}

comm_of() { # the kernel's comm (15 chars) of a program path
    local b
    b=$(basename "$1")
    echo "${b:0:15}"
}

# target_comms PROGRAM: the comms the program may run under (heaptrack runs the program
# by its resolved path, e.g. python3.11 for python3).
target_comms() {
    local real
    comm_of "$1"
    real=$(readlink -f "$(command -v "$1")")
    comm_of "$real"
}

results="$tmp/results.tsv" # workload tool round wall_ms rss_kb tool_rss_kb out_bytes time_kb cpu_ms tool_cpu_ms
: >"$results"

# run_one WORKLOAD TOOL ROUND
run_one() {
    local w=$1 t=$2 r=$3 out="$tmp/out" rssf="$tmp/rss" timef="$tmp/time"
    workload_cmd "$w"
    rm -rf "$out" "$rssf" "$timef" "$tmp/stdout"
    mkdir -p "$out"
    tool_prefix "$t" "$out/trace"
    local t0 t1 rc=0
    t0=$EPOCHREALTIME
    LD_PRELOAD="$peaklib${LD_PRELOAD:+:$LD_PRELOAD}" BENCH_PEAK_RSS_FILE="$rssf" \
        timeout -k 10 600 /usr/bin/time -f %M -o "$timef" "${pre[@]}" "${cmd[@]}" \
        >"$tmp/stdout" 2>"$tmp/stderr" </dev/null || rc=$?
    t1=$EPOCHREALTIME
    if [ $rc -ne 0 ]; then
        echo "bench_overhead: $w under $t exited with $rc:" >&2
        tail -5 "$tmp/stderr" >&2
        return 1
    fi
    # The program's output must be there unchanged (heaptrack adds lines of its own).
    if [ "$t" = plain ]; then
        cp "$tmp/stdout" "$tmp/expected.$w"
    elif [ -s "$tmp/expected.$w" ] &&
        [ "$(grep -Fxc -f "$tmp/expected.$w" "$tmp/stdout" || true)" -lt "$(wc -l <"$tmp/expected.$w")" ]; then
        echo "bench_overhead: $w under $t printed something else:" >&2
        head -5 "$tmp/stdout" >&2
        return 1
    fi
    local comms rss cpu tool_rss=0 tool_cpu=0 bytes=0
    comms=$(target_comms "${cmd[0]}" | paste -sd' ')
    rss=$(awk -v c=" $comms " 'index(c, " " $2 " ") && $3 > m { m = $3 } END { print m + 0 }' "$rssf")
    cpu=$(awk -v c=" $comms " 'index(c, " " $2 " ") { m += $4 } END { print m + 0 }' "$rssf")
    if [ "$rss" -le 0 ]; then
        echo "bench_overhead: no peak RSS reported by $comms ($w under $t):" >&2
        cat "$rssf" >&2
        return 1
    fi
    local tool_re='^$'
    case "$t" in
    heapprof*) tool_re='^heapprof$' ;;
    heaptrack) tool_re='^(heaptrack_inter|zstd|gzip)$' ;;
    esac
    tool_rss=$(awk -v re="$tool_re" '$2 ~ re && $3 > m { m = $3 } END { print m + 0 }' "$rssf")
    tool_cpu=$(awk -v re="$tool_re" '$2 ~ re { m += $4 } END { print m + 0 }' "$rssf")
    if [ "$t" != plain ] && [ "$t" != producer4k ]; then
        bytes=$(cat "$out"/trace* 2>/dev/null | wc -c)
        if [ "$bytes" -le 0 ]; then
            echo "bench_overhead: $w under $t wrote no output" >&2
            return 1
        fi
    fi
    local wall_ms
    wall_ms=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.2f", (b - a) * 1000 }')
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$w" "$t" "$r" "$wall_ms" "$rss" \
        "$tool_rss" "$bytes" "$(tail -1 "$timef")" "$cpu" "$tool_cpu" >>"$results"
    if [ -n "${BENCH_VERBOSE:-}" ]; then
        echo "# round $r $w $t: ${wall_ms} ms, cpu ${cpu} ms, rss ${rss} KiB, tool ${tool_rss} KiB ${tool_cpu} ms, $bytes bytes" >&2
    fi
    rm -rf "$out"
}

echo "# load average before: $(cut -d' ' -f1-3 /proc/loadavg) ($(nproc) CPUs)"
if printf '%s\n' "${tools[@]}" | grep -qx producer4k; then
    producer_start
    trap 'producer_stop; rm -rf "$tmp"' EXIT
fi
status=0
# Warm-up (page cache, python's bytecode cache), not measured.
for w in "${workloads[@]}"; do
    run_one "$w" plain 0 || status=1
done
: >"$results"
for ((r = 1; r <= rounds; r++)); do
    for w in "${workloads[@]}"; do
        n=${#tools[@]}
        for ((k = 0; k < n; k++)); do
            t=${tools[$(((k + r) % n))]}
            run_one "$w" "$t" "$r" || status=1
        done
    done
done
[ $status -eq 0 ] || { echo "bench_overhead: some runs failed" >&2; exit 1; }
echo "# load average after: $(cut -d' ' -f1-3 /proc/loadavg)"

python3 - "$results" "${workloads[*]}" "${tools[*]}" <<'EOF'
import statistics
import sys

path, workloads, tools = sys.argv[1], sys.argv[2].split(), sys.argv[3].split()
rows = {}
for line in open(path):
    w, t, r, wall, rss, tool_rss, out, time_kb, cpu, tool_cpu = line.split("\t")
    rows.setdefault((w, t), []).append((float(wall), int(rss), int(tool_rss), int(out),
                                        int(time_kb), int(cpu), int(tool_cpu)))

def med(w, t, i):
    return statistics.median(x[i] for x in rows[(w, t)])

def goal(w, t, ratio, ht):
    real = not w.startswith("churn")
    if t == "heapprof4k":
        limit = 1.05 if real else 1.10
    elif t == "heapprof512k":
        limit = 1.02
    elif t == "heapprof1" and ht is not None:
        ok = ratio <= ht
        return "%s (<= heaptrack's %.2fx)" % ("met" if ok else "MISSED", ht)
    else:
        return ""
    ok = ratio <= limit and (ht is None or ratio < ht)
    return "%s (<= %.2fx%s)" % ("met" if ok else "MISSED", limit,
                                 ", < heaptrack" if ht is not None else "")

table = []
missed = []
for w in workloads:
    base_wall, base_rss = med(w, "plain", 0), med(w, "plain", 1)
    time_kb = med(w, "plain", 4)
    if abs(time_kb - base_rss) > 0.1 * base_rss + 512:
        print("# %s: /usr/bin/time says %d KiB unprofiled, the program's VmHWM %d KiB"
              % (w, time_kb, base_rss))
    print("bench: overhead_%s_plain_wall_ms %.1f ms" % (w, base_wall))
    print("bench: overhead_%s_plain_rss_kb %d KiB" % (w, base_rss))
    base_cpu = max(med(w, "plain", 5), 1)
    print("bench: overhead_%s_plain_cpu_ms %d ms" % (w, base_cpu))
    ht = None
    if (w, "heaptrack") in rows:
        ht = med(w, "heaptrack", 0) / base_wall
    table.append((w, "unprofiled", "%.0f ms" % base_wall, "1.00x", "%d ms" % base_cpu,
                  "1.00x", "%d KiB" % base_rss, "1.00x", "", "", "", ""))
    for t in tools:
        if t == "plain":
            continue
        wall_ratio = med(w, t, 0) / base_wall
        rss_ratio = med(w, t, 1) / base_rss
        cpu_ratio = med(w, t, 5) / base_cpu
        if w == "empty":
            extra = med(w, t, 0) - base_wall
            print("bench: overhead_empty_%s_extra_wall_ms %.1f ms" % (t, extra))
            print("bench: overhead_empty_%s_tool_cpu_ms %d ms" % (t, med(w, t, 6)))
            table.append((w, t, "%.0f ms" % med(w, t, 0), "+%.0f ms" % extra, "", "",
                          "%d KiB" % med(w, t, 1), "%.2fx" % rss_ratio, "%d KiB" % med(w, t, 2),
                          "%d ms" % med(w, t, 6), "%d" % med(w, t, 3), ""))
            continue
        tool_rss, out = med(w, t, 2), med(w, t, 3)
        print("bench: overhead_%s_%s_wall_ratio %.3f ratio" % (w, t, wall_ratio))
        print("bench: overhead_%s_%s_cpu_ratio %.3f ratio" % (w, t, cpu_ratio))
        print("bench: overhead_%s_%s_rss_ratio %.3f ratio" % (w, t, rss_ratio))
        print("bench: overhead_%s_%s_output_bytes %d bytes" % (w, t, out))
        print("bench: overhead_%s_%s_tool_rss_kb %d KiB" % (w, t, tool_rss))
        print("bench: overhead_%s_%s_tool_cpu_ms %d ms" % (w, t, med(w, t, 6)))
        if t == "producer4k" and (w, "heapprof4k") in rows:
            print("bench: overhead_%s_producer4k_vs_heapprof4k_cpu_ratio %.3f ratio"
                  % (w, med(w, t, 5) / max(med(w, "heapprof4k", 5), 1)))
        g = goal(w, t, wall_ratio, ht if t != "heaptrack" else None)
        if g.startswith("MISSED"):
            missed.append("%s %s %.2fx" % (w, t, wall_ratio))
        table.append((w, t, "%.0f ms" % med(w, t, 0), "%.2fx" % wall_ratio,
                      "%d ms" % med(w, t, 5), "%.2fx" % cpu_ratio, "%d KiB" % med(w, t, 1), "%.2fx" % rss_ratio,
                      "%d KiB" % tool_rss, "%d ms" % med(w, t, 6), "%d" % out, g))

print()
print("| workload | tool | wall (median) | wall ratio | program CPU | CPU ratio "
      "| program peak RSS | RSS ratio | profiler's own RSS | profiler's own CPU | output bytes "
      "| wall-time goal |")
print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
for row in table:
    print("| " + " | ".join(row) + " |")
print()
if missed:
    print("# goals missed: " + "; ".join(missed))
else:
    print("# all wall-time goals met")
EOF
