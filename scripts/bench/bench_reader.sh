#!/usr/bin/env bash
# scripts/bench/bench_reader.sh: the trace reader's memory per byte of input, from the
# maximum RSS of `heapprof report` less that of reading an empty trace:
#   reader_rss_per_input_byte_crafted  the crafted trace of the safety review (A11:
#                                      one 4096-frame callstack, 2000 one-sample dumps)
#   reader_rss_per_input_byte_real     a real trace of 14 continuous dumps of a program
#                                      that leaks, read with every dump kept (--growth)
# Run through `scripts/bench.sh reader` (which builds build-release).
set -euo pipefail
cd "$(dirname "$0")/../.."
B=${HEAPPROF_BUILD:-build-release}
HP="$B/cli/heapprof"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

rss_kb() { /usr/bin/time -f %M "$@" 2>&1 >/dev/null | tail -1; }

: >"$tmp/empty.pftrace"
base=$(rss_kb "$HP" report "$tmp/empty.pftrace")

python3 tests/bench/craft_trace.py a11 2000 >"$tmp/a11.pftrace"
rss=$(rss_kb "$HP" report --no-stacks "$tmp/a11.pftrace")
size=$(stat -c %s "$tmp/a11.pftrace")
awk -v r="$rss" -v b="$base" -v s="$size" \
    'BEGIN { printf "bench: reader_rss_per_input_byte_crafted %.1f bytes/byte\n", (r - b) * 1024 / s }'

cat >"$tmp/leak.c" <<'C'
#include <stdlib.h>
#include <string.h>
#include <time.h>
static void *cache[1 << 16];
__attribute__((noinline)) void *leaky_cache_insert(size_t n) { return memset(malloc(n), 1, n); }
__attribute__((noinline)) void churn(void) { free(memset(malloc(300), 2, 300)); }
/* Many call sites, as real programs have: the same work at call depths 1 to 300. */
__attribute__((noinline)) int deep(int d, int i) {
    if (d > 0)
        return deep(d - 1, i) + 1;
    cache[i % (1 << 16)] = leaky_cache_insert(2048);
    for (int k = 0; k < 50; k++)
        churn();
    return 0;
}
int main(void) {
    struct timespec ms = {0, 1000000};
    for (int i = 0; i < 1300; i++) {
        deep(i % 300, i);
        nanosleep(&ms, NULL);
    }
    return cache[7] == NULL;
}
C
cc -O1 -g -o "$tmp/leak" "$tmp/leak.c"
"$HP" record -q --continuous-dump 100 -o "$tmp/leak.pftrace" -- "$tmp/leak"
rss=$(rss_kb "$HP" report --growth "$tmp/leak.pftrace")
size=$(stat -c %s "$tmp/leak.pftrace")
dumps=$("$HP" report "$tmp/leak.pftrace" | sed -n 's/.* \([0-9]*\) dumps,.*/\1/p' | head -1)
awk -v r="$rss" -v b="$base" -v s="$size" -v d="$dumps" \
    'BEGIN { printf "bench: reader_rss_per_input_byte_real %.1f bytes/byte\n", (r - b) * 1024 / s;
             printf "# real trace: %d bytes, %s dumps\n", s, d }'
