#!/usr/bin/env bash
# scripts/bench/bench_html.sh: `heapprof html` on a profile of 100,000 distinct stacks
# (tests/programs/many_sites: a binary recursion 17 levels deep, recorded exactly):
#   html_render_ms_100k_stacks  time to first paint of the page in headless Chromium,
#                               loaded from disk (the page's own performance.now() once
#                               the flame graph is drawn and a frame has gone by); the
#                               median of 3 loads
#   html_click_ms_100k_stacks   a click that zooms into a frame, drawn and laid out
#   html_write_ms_100k_stacks   `heapprof html` itself: reading the trace, writing the page
#   html_bytes_per_stack        the page's size per distinct stack
# Needs chromium (scripts/install-deps.sh). Run through `scripts/bench.sh html`.
set -euo pipefail
cd "$(dirname "$0")/../.."
B=${HEAPPROF_BUILD:-build-release}
HP="$B/cli/heapprof"
MANY="$B/tests/programs/many_sites"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

if ! command -v chromium >/dev/null 2>&1; then
    echo "bench_html: chromium is not installed (scripts/install-deps.sh)" >&2
    exit 1
fi
[ -x "$MANY" ] || { echo "bench_html: $MANY not built (tests disabled?)" >&2; exit 1; }

"$HP" record -q -i 1 -o "$tmp/many.pftrace" -- "$MANY" 17 100000 >/dev/null
start=$(date +%s%N)
out=$("$HP" html "$tmp/many.pftrace" -o "$tmp/many.html")
end=$(date +%s%N)
stacks=$(sed -n 's/.*KiB, \([0-9]*\) stacks)$/\1/p' <<<"$out")
bytes=$(stat -c %s "$tmp/many.html")

paints=()
for _ in 1 2 3; do
    res=$(python3 tests/e2e/html_probe.py "$tmp/many.html" \
        'painted=window.heapprofPaintedMs' \
        "click=(() => { const t = performance.now();
            const b = Array.from(document.querySelectorAll('#hp-flame .f'))
                .find(e => e.textContent === 'site_left');
            b.click(); document.body.offsetHeight; return performance.now() - t; })()")
    if grep -q '^error' <<<"$res"; then
        echo "bench_html: the page logged errors: $res" >&2
        exit 1
    fi
    paints+=("$(sed -n 's/^painted //p' <<<"$res") $(sed -n 's/^click //p' <<<"$res")")
done
median() { sort -n | sed -n 2p; }
paint=$(printf '%s\n' "${paints[@]}" | awk '{print $1}' | median)
click=$(printf '%s\n' "${paints[@]}" | awk '{print $2}' | median)
awk -v p="$paint" -v c="$click" -v w="$(((end - start) / 1000000))" -v b="$bytes" -v s="$stacks" \
    'BEGIN { printf "bench: html_render_ms_100k_stacks %.0f ms\n", p;
             printf "bench: html_click_ms_100k_stacks %.0f ms\n", c;
             printf "bench: html_write_ms_100k_stacks %d ms\n", w;
             printf "bench: html_bytes_per_stack %.1f bytes\n", b / s;
             printf "# %d stacks, page %d bytes\n", s, b }'
