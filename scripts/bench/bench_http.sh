#!/usr/bin/env bash
# How long heapprofd --http takes to serve one process's profile when it holds 100 k live
# samples. Run by `scripts/bench.sh http` (which builds build-release and sets
# HEAPPROF_BUILD).
#
# heapprofd (-n many_sites -i 1: every allocation sampled, --http on a free loopback
# port) profiles tests/programs/many_sites 18 hold: 262 144 allocations of 100 bytes at
# as many call stacks (18 frames deep), every other one freed, so 131 072 live samples at
# 131 072 live sites, which it then holds. Once the daemon has every sample, the profile
# is fetched ROUNDS times; the time is from the request to the last byte of the gzipped
# pprof (the bookkeeping thread's snapshot, reading it back, the pprof encoding).
#   http_heap_ms  the median over ROUNDS requests
#
# Environment: BENCH_HTTP_ROUNDS (default 5), BENCH_HTTP_BITS (default 18),
# HEAPPROF_BUILD (default build-release).
set -euo pipefail
cd "$(dirname "$0")/../.."

build=${HEAPPROF_BUILD:-$PWD/build-release}
rounds=${BENCH_HTTP_ROUNDS:-5}
bits=${BENCH_HTTP_BITS:-18}
daemon="$build/cli/heapprofd"
prog="$build/tests/programs/many_sites"
lib="$build/preload/libheapprof.so"
for f in "$daemon" "$prog" "$lib"; do
    [ -e "$f" ] || { echo "bench_http: $f missing (build first)" >&2; exit 1; }
done
tmp=$(mktemp -d /tmp/heapprof-bench_http.XXXXXX)
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
    rm -rf "$tmp"
}
trap cleanup EXIT
fail() {
    echo "bench_http: $1" >&2
    cat "$2" >&2
    exit 1
}

"$daemon" --socket "$tmp/s.sock" -o "$tmp/out.pftrace" --no-status -n many_sites --no-running \
    -i 1 --block-client --block-timeout-us 10000000 --http 127.0.0.1:0 2>"$tmp/daemon.log" &
pids+=($!)
url=
for _ in $(seq 500); do
    url=$(grep -o 'serving pprof on http://[^ ]*' "$tmp/daemon.log" | cut -d' ' -f4 || true)
    [ -n "$url" ] && break
    sleep 0.01
done
[ -n "$url" ] || fail "heapprofd did not serve --http" "$tmp/daemon.log"

LD_PRELOAD="$lib" HEAPPROF_SOCKET="$tmp/s.sock" HEAPPROF_STARTUP=1 "$prog" "$bits" hold \
    >"$tmp/prog.out" &
prog_pid=$!
pids+=("$prog_pid")

# The fetches, timed inside one python3 (its start-up is not measured): waits until the
# index shows every allocation of the program, then prints one time in ms per request.
python3 - "$url" "$prog_pid" "$((1 << bits))" "$rounds" >"$tmp/times" 2>"$tmp/py.log" <<'EOF' ||
import re, sys, time, urllib.request
url, pid, want, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
deadline = time.time() + 300
while True:
    page = urllib.request.urlopen(url, timeout=60).read().decode()
    m = re.search(r'<tr><td class=n>%s</td><td>[^<]*</td><td class=n>(\d+)' % pid, page)
    if m and int(m.group(1)) >= want:
        break
    if time.time() > deadline:
        sys.exit("the daemon never had every sample: %s" % (m.group(1) if m else "not listed"))
    time.sleep(0.2)
for _ in range(rounds):
    t0 = time.monotonic()
    body = urllib.request.urlopen(url + "debug/pprof/heap?pid=" + pid, timeout=120).read()
    ms = (time.monotonic() - t0) * 1000
    if body[:2] != b"\x1f\x8b":
        sys.exit("not a gzipped profile")
    print("%.0f %d" % (ms, len(body)))
EOF
    fail "fetching the profile failed" "$tmp/py.log"

ms=$(cut -d' ' -f1 "$tmp/times" | sort -n | awk '{v[NR]=$1} END {print v[int((NR+1)/2)]}')
bytes=$(head -1 "$tmp/times" | cut -d' ' -f2)
echo "# $((1 << (bits - 1))) live samples at as many sites; profile $bytes bytes gzipped;" \
    "ms per request: $(cut -d' ' -f1 "$tmp/times" | tr '\n' ' ')"
echo "bench: http_heap_ms $ms ms"
