#!/usr/bin/env bash
# Installs the Debian packages heapprof needs to build, test and benchmark.
# Idempotent: when everything is present it only checks and returns.
set -euo pipefail

PKGS=(
    build-essential pkg-config meson ninja-build
    libunwind-dev libelf-dev libdw-dev elfutils
    nanopb libnanopb-dev
    libcmocka-dev zlib1g-dev
    protobuf-compiler python3
    clang llvm libclang-rt-dev clang-format
    sqlite3 libc6-dbg golang-go
    libiberty-dev rustc
    heaptrack time jq
    # other allocators, for the tests of programs that use them (linked and preloaded)
    libjemalloc2 libjemalloc-dev libtcmalloc-minimal4 libmimalloc2.0
    # node, whose JIT code the JIT tests and benchmarks walk and name
    nodejs
    # a C extension between Python frames, for the tests of Python stacks
    python3-numpy
    # a daemonizing, privilege-dropping server for the end-to-end tests (never started
    # as a system service: see below) and its client
    nginx-light curl
)

# A headless browser for the tests and benchmark of `heapprof html`: any chromium on the
# PATH will do.
if ! command -v chromium >/dev/null 2>&1; then
    PKGS+=(chromium)
fi
# And Firefox: the page must work in both (tests/e2e/html_probe_firefox.py).
if ! command -v firefox-esr >/dev/null 2>&1 && ! command -v firefox >/dev/null 2>&1; then
    PKGS+=(firefox-esr)
fi

missing=()
for p in "${PKGS[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
        missing+=("$p")
    fi
done

if [ ${#missing[@]} -eq 0 ]; then
    exit 0
fi

echo "install-deps: installing ${missing[*]}" >&2
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    SUDO="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
# Packages of servers must not start them (nginx would take port 80): the tests run
# their own instances. Debian asks policy-rc.d; one that refuses is put in place for the
# install when the machine has none.
POLICY=/usr/sbin/policy-rc.d
if [ ! -e "$POLICY" ]; then
    printf '#!/bin/sh\nexit 101\n' | $SUDO tee "$POLICY" >/dev/null
    $SUDO chmod 755 "$POLICY"
    trap '$SUDO rm -f "$POLICY"' EXIT
fi
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
