#!/usr/bin/env bash
# The whole test suite: installs dependencies, builds with warnings as errors, runs the
# unit, end-to-end and fuzz-replay suites, then the unit suites again under ASan/UBSan and
# TSan, runs every libFuzzer target for a bounded time when clang is available, and checks
# formatting. Prints "N passed, N failed" at the end.
#
#   scripts/test.sh            # everything
#   scripts/test.sh --quick    # main build only
set -uo pipefail
cd "$(dirname "$0")/.."

quick=0
[ "${1:-}" = "--quick" ] && quick=1

scripts/install-deps.sh || { echo "install-deps failed"; exit 1; }

passed=0
failed=0
failures=()

count_results() { # build dir, label
    local log="$1/meson-logs/testlog.json"
    [ -f "$log" ] || return
    local p f
    p=$(grep -c '"result": "OK"' "$log" || true)
    f=$(grep -cE '"result": "(FAIL|TIMEOUT|ERROR|UNEXPECTEDPASS)"' "$log" || true)
    passed=$((passed + p))
    failed=$((failed + f))
    if [ "$f" -gt 0 ]; then
        failures+=("$2: $(grep -oE '"name": "[^"]*"[^}]*"result": "(FAIL|TIMEOUT|ERROR)"' "$log" |
            sed -E 's/"name": "([^"]*)".*/\1/' | tr '\n' ' ')")
    fi
}

setup() { # dir, extra options...
    local dir="$1"
    shift
    if [ -d "$dir" ] && [ -f "$dir/build.ninja" ]; then
        meson configure "$dir" "$@" >/dev/null || return 1
    else
        rm -rf "$dir"
        meson setup "$dir" "$@" >/dev/null || return 1
    fi
}

step() { # label, build dir, meson test args...
    local label="$1" dir="$2"
    shift 2
    echo "=== $label"
    if ! ninja -C "$dir" -j2 >"$dir/ninja.log" 2>&1; then
        tail -50 "$dir/ninja.log"
        echo "=== $label: BUILD FAILED"
        failed=$((failed + 1))
        failures+=("$label: build")
        return
    fi
    meson test -C "$dir" --print-errorlogs --num-processes 2 "$@"
    count_results "$dir" "$label"
}

setup build-ci -Dwerror=true -Dbuildtype=debugoptimized -Dtests=enabled || exit 1
step "main build: unit, e2e, fuzz-replay" build-ci

if [ $quick -eq 0 ]; then
    setup build-asan -Dwerror=true -Dbuildtype=debug -Dtests=enabled \
        -Db_sanitize=address,undefined -Db_lundef=false || exit 1
    ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
        step "ASan/UBSan build" build-asan --no-suite no-asan

    setup build-tsan -Dwerror=true -Dbuildtype=debug -Dtests=enabled \
        -Db_sanitize=thread -Db_lundef=false || exit 1
    TSAN_OPTIONS=halt_on_error=1 step "TSan build" build-tsan --no-suite no-asan --no-suite no-tsan

    # Every libFuzzer target (tests/fuzz/fuzz_*.c) runs for a bounded time from its seed
    # corpus; new inputs go to a scratch directory, a crash, leak or timeout is a failure.
    if command -v clang >/dev/null && command -v clang++ >/dev/null; then
        echo "=== fuzz (libFuzzer, 8 s per target)"
        if CC=clang CXX=clang++ setup build-fuzz -Dfuzzing=true -Db_sanitize=address,undefined \
            -Db_lundef=false && ninja -C build-fuzz -j2 >build-fuzz/ninja.log 2>&1; then
            # Two targets at a time, one per core: 11 targets took 2 min one by one.
            fuzz_one() { # target binary; writes build-fuzz/fuzz_NAME.{log,rc}
                local fz="$1" name=${1##*/fuzz_} scratch
                scratch=$(mktemp -d)
                UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 "$fz" -max_total_time=8 \
                    -timeout=10 -rss_limit_mb=2048 -artifact_prefix=build-fuzz/ "$scratch" \
                    "tests/fuzz/corpus/$name" >"build-fuzz/fuzz_$name.log" 2>&1
                echo $? >"build-fuzz/fuzz_$name.rc"
                rm -rf "$scratch"
            }
            targets=()
            for fz in build-fuzz/tests/fuzz/fuzz_*; do
                [ -x "$fz" ] && [ -f "$fz" ] && targets+=("$fz")
            done
            for ((i = 0; i < ${#targets[@]}; i += 2)); do
                fuzz_one "${targets[i]}" &
                [ $((i + 1)) -lt ${#targets[@]} ] && fuzz_one "${targets[i + 1]}" &
                wait
            done
            for fz in "${targets[@]}"; do
                name=${fz##*/fuzz_}
                if [ "$(cat "build-fuzz/fuzz_$name.rc" 2>/dev/null)" = 0 ]; then
                    echo "fuzz_$name: $(grep -E '^Done' "build-fuzz/fuzz_$name.log")"
                    passed=$((passed + 1))
                else
                    tail -40 "build-fuzz/fuzz_$name.log"
                    echo "fuzz_$name: FAILED (input saved under build-fuzz/)"
                    failed=$((failed + 1))
                    failures+=("fuzz: $name")
                fi
            done
        else
            [ -f build-fuzz/ninja.log ] && tail -50 build-fuzz/ninja.log
            echo "=== fuzz: BUILD FAILED"
            failed=$((failed + 1))
            failures+=("fuzz: build")
        fi
    fi

    echo "=== clang-format"
    if command -v clang-format >/dev/null; then
        bad=$(git ls-files '*.c' '*.h' '*.cpp' | xargs clang-format --dry-run --Werror 2>&1 |
            grep -oE '^[^:]+\.(c|h|cpp):' | sort -u)
        if [ -n "$bad" ]; then
            echo "not clang-formatted: $bad"
            failed=$((failed + 1))
            failures+=("clang-format: $bad")
        else
            passed=$((passed + 1))
        fi
    fi
fi

echo
for f in "${failures[@]}"; do echo "FAILED: $f"; done
echo "${passed} passed, ${failed} failed"
[ "$failed" -eq 0 ]
