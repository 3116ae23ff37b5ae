#!/usr/bin/env python3
"""tests/report/check_rules.py: runs rp_check_trace (the trace-processor import
rules) on gen_trace's small and big traces, and on broken copies of the big one, which it
must reject.

usage: check_rules.py GEN_TRACE CHECK_TRACE
"""
import os
import subprocess
import sys
import tempfile


def packets(data):
    """Byte ranges of the framed Trace.packet fields."""
    out, i = [], 0
    while i < len(data):
        start = i
        assert data[i] == 0x0A
        i += 1
        n, shift = 0, 0
        while True:
            b = data[i]
            i += 1
            n |= (b & 0x7F) << shift
            shift += 7
            if not b & 0x80:
                break
        i += n
        out.append((start, i))
    return out


def main():
    gen, check = sys.argv[1:3]
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        small = os.path.join(tmp, "small.pftrace")
        big = os.path.join(tmp, "big.pftrace")
        subprocess.run([gen, small], check=True)
        subprocess.run([gen, big, "big"], check=True)
        res = subprocess.run([check, small, big], capture_output=True, text=True)
        sys.stdout.write(res.stdout)
        if res.returncode != 0:
            failures.append("valid traces rejected: " + res.stderr)
        data = open(big, "rb").read()
        pk = packets(data)
        if len(pk) < 20:
            failures.append("big trace has only %d packets" % len(pk))
        # A packet lost in the middle (index gap or undefined ids), and a file cut inside
        # a dump, must both be caught.
        mid = pk[len(pk) // 2]
        broken = {
            "dropped_packet": data[:mid[0]] + data[mid[1]:],
            "ends_in_dump": data[:pk[3][1]],
        }
        for name, content in broken.items():
            path = os.path.join(tmp, name + ".pftrace")
            open(path, "wb").write(content)
            res = subprocess.run([check, path], capture_output=True, text=True)
            if res.returncode == 0:
                failures.append("%s accepted" % name)
    for f in failures:
        sys.stderr.write("FAIL: %s\n" % f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
