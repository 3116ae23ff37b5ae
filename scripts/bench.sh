#!/usr/bin/env bash
# Benchmarks: builds a release tree (build-release) and runs the benchmark programs whose
# names start with one of the given prefixes (all when none is given). Every figure is
# printed on its own line as `bench: <name> <value> <unit>`; ratios and rates are taken
# against a baseline measured in the same run.
#
#   scripts/bench.sh                 # everything
#   scripts/bench.sh ring client     # bench_ring*, bench_client*
#   scripts/bench.sh attach          # wake latency, idle and busy; 100 attach cycles;
#                                    # the same for injected attaches, and their stop times
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/install-deps.sh
if [ ! -f build-release/build.ninja ]; then
    meson setup build-release -Dbuildtype=release -Db_ndebug=true >/dev/null
fi
ninja -C build-release -j2 >/dev/null

export HEAPPROF_BUILD="$PWD/build-release"
status=0
for b in build-release/tests/bench/bench_* scripts/bench/bench_*.sh; do
    [ -f "$b" ] && [ -x "$b" ] || continue # not the build's .p folders
    name=$(basename "$b")
    name=${name#bench_}
    name=${name%.sh}
    if [ $# -gt 0 ]; then
        match=0
        for p in "$@"; do
            case "$name" in "$p"*) match=1 ;; esac
        done
        [ $match -eq 1 ] || continue
    fi
    echo "# $name"
    "$b" || { echo "bench $name failed" >&2; status=1; }
done
exit $status
