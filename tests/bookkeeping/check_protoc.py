#!/usr/bin/env python3
"""tests/bookkeeping/check_protoc.py: decodes a trace written by bookkeeping with
`protoc --decode=perfetto.protos.Trace` against protos/*.proto and checks the result.

usage: check_protoc.py GEN_TRACE PROTOC PROTOS_DIR
"""
import os
import re
import subprocess
import sys
import tempfile


def main():
    gen_trace, protoc, protos_dir = sys.argv[1:4]
    with tempfile.TemporaryDirectory() as tmp:
        trace = os.path.join(tmp, "out.pftrace")
        subprocess.run([gen_trace, trace], check=True)
        with open(trace, "rb") as f:
            res = subprocess.run(
                [protoc, "--decode=perfetto.protos.Trace", "-I", protos_dir, "trace.proto"],
                stdin=f, capture_output=True, text=True)
    if res.returncode != 0:
        sys.stderr.write("protoc failed (%d):\n%s" % (res.returncode, res.stderr))
        return 1
    text = res.stdout
    failures = []
    # Fields protoc does not know are printed by number: there must be none.
    unknown = re.findall(r"^\s*\d+\s*[:{]", text, re.MULTILINE)
    if unknown:
        failures.append("unknown fields: %r" % unknown[:5])
    expected = [
        "sequence_flags: 1",
        "sequence_flags: 2",
        "trusted_packet_sequence_id: 7",
        "clock_id: 6",
        "clock_id: 4",
        "primary_trace_clock: BUILTIN_CLOCK_BOOTTIME",
        'cmdline: "--flag"',
        'heap_name: "libc.malloc"',
        'str: "_ZN3foo3barEv"',
        'str: "libc.so.6"',
        "self_max: 81920",
        "self_max_count: 10",
        "self_freed: 20480",
        "disconnected: true",
        "continued: false",
        "index: 0",
        "index: 3",
        "max_bucket: true",
        # ModuleSymbols for the libc frame (rel_pc 0x1234), with its raw build id.
        'path: "/usr/lib/x86_64-linux-gnu/libc.so.6"',
        'build_id: "\\336\\255\\276\\357"',
        "address: 4660",
        'function_name: "malloc"',
        'source_file_name: "malloc/malloc.c"',
        "line_number: 564",
    ]
    for e in expected:
        if e not in text:
            failures.append("missing %r" % e)
    if text.count("module_symbols {") != 1:
        failures.append("%d module_symbols packets, want 1" % text.count("module_symbols {"))
    if text.count("packet {") < 8:
        failures.append("only %d packets" % text.count("packet {"))
    if failures:
        sys.stderr.write("\n".join(failures) + "\n--- decoded trace ---\n" + text)
        return 1
    print("protoc decoded %d packets" % text.count("packet {"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
