#!/usr/bin/env bash
# Checks that every C file of the components includes its own header first: the header of
# the same name when there is one, else its component's header (a quoted project header),
# then system headers, then others (STYLE.md). Prints the offenders; exit 1 if any.
set -euo pipefail
cd "$(dirname "$0")/.."
bad=0
for f in $(git ls-files '*.c' | grep -v '^tests/'); do
    first=$(grep -m1 '^#include' "$f" || true)
    own="${f%.c}.h"
    if [ -f "$own" ]; then
        want="#include \"$own\""
        [ "$first" = "$want" ] && continue
        echo "$f: first include is '$first', not its own header $own"
    else
        [[ "$first" =~ ^#include\ \"${f%%/*}/[a-z_]+\.h\"$ ]] && continue
        echo "$f: first include is '$first', not a header of ${f%%/*}/"
    fi
    bad=1
done
exit $bad
