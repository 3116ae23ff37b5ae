#!/usr/bin/env bash
# Checks that libheapprof.so exports exactly the allocator entry points, dlopen, _exit and
# _Exit, and the heap API (preload/include/heapprof.h).
# Usage: scripts/check-exports.sh BUILD_DIR/preload/libheapprof.so
set -euo pipefail

lib=${1:?usage: check-exports.sh path/to/libheapprof.so}
allowed="_Exit _exit aligned_alloc calloc dlopen free free_aligned_sized free_sized malloc memalign posix_memalign pvalloc realloc reallocarray valloc"
allowed="$allowed heapprof_register_heap heapprof_report_allocation heapprof_report_free heapprof_report_sample"

actual=$(nm -D --defined-only "$lib" | awk '{print $NF}' | sed 's/@.*//' | sort -u | tr '\n' ' ')
expected=$(echo "$allowed" | tr ' ' '\n' | sort -u | tr '\n' ' ')

if [ "$actual" != "$expected" ]; then
    echo "check-exports: $lib exports unexpected symbols" >&2
    echo "  expected: $expected" >&2
    echo "  actual:   $actual" >&2
    exit 1
fi
echo "check-exports: ok ($lib)"
