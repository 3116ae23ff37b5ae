#!/usr/bin/env bash
# Installs dependencies, builds heapprof and profiles the bundled demo program: prints the
# top allocation sites and the path of the Perfetto trace.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/install-deps.sh
if [ ! -f build/build.ninja ]; then
    meson setup build >/dev/null
fi
ninja -C build -j2 >/dev/null

trace="${1:-heapprof-demo.pftrace}"
echo "--- profiling build/tests/programs/demo (every allocation recorded: -i 1)"
build/cli/heapprof record -i 1 -o "$trace" -- build/tests/programs/demo
echo
echo "--- the full report: build/cli/heapprof report $trace"
build/cli/heapprof report --top 5 "$trace"
echo
echo "trace: $(realpath "$trace") (open it at ui.perfetto.dev)"
