# scripts/bench/svc_setup.sh: what the service benchmarks (bench_svc_*.sh) share, sourced
# from the repository's root with the bench's name and default rounds:
#   . scripts/bench/svc_setup.sh bench_svc_rss 3
# Sets build, rounds (BENCH_SVC_ROUNDS), daemon (BENCH_SVC_DAEMON, default the build's
# heapprofd) and client (the build's hostile_client), checks they exist, makes a scratch
# directory tmp and kills the processes in pids and removes tmp at exit.
# shellcheck shell=bash disable=SC2034  # sourced: its variables are the caller's
build=${HEAPPROF_BUILD:-$PWD/build-release}
rounds=${BENCH_SVC_ROUNDS:-$2}
daemon=${BENCH_SVC_DAEMON:-$build/cli/heapprofd}
client="$build/tests/programs/hostile_client"
for f in "$daemon" "$client"; do
    [ -x "$f" ] || { echo "$1: $f missing (build first)" >&2; exit 1; }
done

tmp=$(mktemp -d "/tmp/heapprof-$1.XXXXXX")
pids=()
svc_setup_cleanup() {
    for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
    rm -rf "$tmp"
}
trap svc_setup_cleanup EXIT

now_ns() { date +%s%N; }
