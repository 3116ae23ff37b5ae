#!/usr/bin/env bash
# Checks (or with --fix, applies) clang-format on the tracked C sources.
set -euo pipefail
cd "$(dirname "$0")/.."
files=$(git ls-files '*.c' '*.h' '*.cpp')
if [ "${1:-}" = "--fix" ]; then
    clang-format -i $files
else
    clang-format --dry-run --Werror $files
fi
