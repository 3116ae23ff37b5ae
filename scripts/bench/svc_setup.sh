# scripts/bench/svc_setup.sh: what the service benchmarks (bench_svc_*.sh) share, sourced
# from the repository's root with the bench's name and default rounds:
#   . scripts/bench/svc_setup.sh bench_svc_rss 3
# Sets build, rounds (BENCH_SVC_ROUNDS), daemon (BENCH_SVC_DAEMON, default the build's
# heapprofd) and client (the build's hostile_client), checks they exist, makes a scratch
# directory tmp and kills the processes in pids and removes tmp at exit. Then:
#   svc_start_daemon ARGS...  heapprofd --all --no-running ARGS on $tmp/s.sock, writing
#                             $tmp/out.pftrace, stderr to $tmp/daemon.log; sets daemon_pid
#                             (added to pids) once its socket is there
#   svc_fail WHAT LOG         says WHAT failed, shows LOG and exits 1
#   median                    the median of the numbers on stdin
# shellcheck shell=bash disable=SC2034  # sourced: its variables are the caller's
build=${HEAPPROF_BUILD:-$PWD/build-release}
rounds=${BENCH_SVC_ROUNDS:-$2}
daemon=${BENCH_SVC_DAEMON:-$build/cli/heapprofd}
client="$build/tests/programs/hostile_client"
for f in "$daemon" "$client"; do
    [ -x "$f" ] || { echo "$1: $f missing (build first)" >&2; exit 1; }
done

svc_bench=$1
tmp=$(mktemp -d "/tmp/heapprof-$1.XXXXXX")
pids=()
svc_setup_cleanup() {
    for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
    rm -rf "$tmp"
}
trap svc_setup_cleanup EXIT

now_ns() { date +%s%N; }

svc_fail() {
    echo "$svc_bench: $1" >&2
    cat "$2" >&2
    exit 1
}

svc_start_daemon() {
    rm -f "$tmp/s.sock" "$tmp/out.pftrace"
    "$daemon" --socket "$tmp/s.sock" -o "$tmp/out.pftrace" --no-status --all --no-running \
        "$@" 2>"$tmp/daemon.log" &
    daemon_pid=$!
    pids+=("$daemon_pid")
    for _ in $(seq 500); do
        [ -S "$tmp/s.sock" ] && return 0
        sleep 0.01
    done
    svc_fail "heapprofd did not start" "$tmp/daemon.log"
}

median() { sort -n | awk '{v[NR] = $1} END {print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }
