#!/usr/bin/env python3
"""tests/report/check_pprof.py: exports the trace of gen_trace as pprof and checks
it with `protoc --decode=perftools.profiles.Profile` against protos/profile.proto.

usage: check_pprof.py GEN_TRACE PPROF_TOOL PROTOC PROTOS_DIR
"""
import gzip
import os
import re
import subprocess
import sys
import tempfile


def decode(protoc, protos_dir, path):
    with open(path, "rb") as f:
        raw = gzip.decompress(f.read())
    res = subprocess.run(
        [protoc, "--decode=perftools.profiles.Profile", "-I", protos_dir, "profile.proto"],
        input=raw, capture_output=True)
    if res.returncode != 0:
        raise SystemExit("protoc failed: %s" % res.stderr.decode())
    return res.stdout.decode()


def samples(text):
    """[(location ids, values)] of every sample."""
    out = []
    for block in re.findall(r"^sample \{\n(.*?)^\}", text, re.MULTILINE | re.DOTALL):
        locs = [int(x) for x in re.findall(r"location_id: (\d+)", block)]
        vals = [int(x) for x in re.findall(r"value: (-?\d+)", block)]
        out.append((locs, vals))
    return out


def main():
    gen_trace, tool, protoc, protos_dir = sys.argv[1:5]
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        trace = os.path.join(tmp, "t.pftrace")
        subprocess.run([gen_trace, trace], check=True)
        out = os.path.join(tmp, "prof")
        res = subprocess.run([tool, trace, out], check=True, capture_output=True, text=True)
        files = sorted(res.stdout.split())
        names = [os.path.basename(f) for f in files]
        # gen_trace: pid 100 has two dumps (the second is its final one), pid 200 too.
        want = ["prof.pid100.libc.malloc.dump1.pb.gz", "prof.pid100.libc.malloc.dump2.pb.gz",
                "prof.pid200.libc.malloc.dump1.pb.gz", "prof.pid200.libc.malloc.dump2.pb.gz"]
        if names != want:
            failures.append("files: %r" % names)
        text = decode(protoc, protos_dir, os.path.join(tmp, want[1]))
        strings = re.findall(r'^string_table: "(.*)"$', text, re.MULTILINE)
        if not strings or strings[0] != "":
            failures.append("string_table[0] is not empty: %r" % strings[:2])
        st = lambda i: strings[i] if i < len(strings) else None
        types = re.findall(r"^sample_type \{\n\s*type: (\d+)\n\s*unit: (\d+)", text, re.MULTILINE)
        got = [(st(int(a)), st(int(b))) for a, b in types]
        if got != [("alloc_objects", "count"), ("alloc_space", "bytes"),
                   ("inuse_objects", "count"), ("inuse_space", "bytes")]:
            failures.append("sample types: %r" % got)
        # Unknown fields would be printed by number.
        if re.findall(r"^\s*\d+\s*[:{]", text, re.MULTILINE):
            failures.append("unknown fields")
        # stack_a: 10 x 4096 allocated, 5 freed; stack_b: 10 x 8192, none freed. Each
        # sampled allocation is 64 bytes at interval 4096, so it stands for
        # 1 / (1 - (1 - 1/4096)^64) = 64.5 allocations: counts 645 and 5 * 64.5 = 323.
        vals = sorted(v for _, v in samples(text))
        if vals != [[645, 40960, 323, 20480], [645, 81920, 645, 81920]]:
            failures.append("values: %r" % vals)
        # Leaf first: the first location of stack_a is malloc in libc (build id deadbeef).
        for name in ["malloc", "_ZN3foo3barEv", "main", "make_buffer",
                     "/usr/lib/x86_64-linux-gnu/libc.so.6", "/usr/bin/app", "deadbeef"]:
            if name not in strings:
                failures.append("string %r missing" % name)
        if "build_id: %d" % strings.index("deadbeef") not in text if "deadbeef" in strings else True:
            failures.append("no mapping carries the build id")
        # The unnamed frame (no mapping) keeps its address as its name.
        if "?+0xdead" not in strings:
            failures.append("the unnamed frame has no name of its own")
        # default_sample_type is a string table index.
        dst = re.search(r"^default_sample_type: (\d+)", text, re.MULTILINE)
        if not dst or st(int(dst.group(1))) != "inuse_space":
            failures.append("default_sample_type: %r" % (dst and st(int(dst.group(1)))))
        # The main executable is the first mapping.
        first = re.search(r"^mapping \{\n(.*?)^\}", text, re.MULTILINE | re.DOTALL)
        fn = first and re.search(r"filename: (\d+)", first.group(1))
        if not fn or st(int(fn.group(1))) != "/usr/bin/app":
            failures.append("first mapping: %r" % (fn and st(int(fn.group(1)))))
        # malloc has a source line in the trace: its Function has the file name.
        if "malloc/malloc.c" not in strings:
            failures.append("no source file names")
        if text.count("\nfunction {") != 5 or text.count("\nmapping {") != 3:
            failures.append("functions/mappings: %d/%d" % (text.count("\nfunction {"),
                                                           text.count("\nmapping {")))
        # Selection: one dump of one process to an exact file name.
        one = os.path.join(tmp, "one.pb.gz")
        subprocess.run([tool, trace, one, "1", "200"], check=True, capture_output=True)
        vals = [v for _, v in samples(decode(protoc, protos_dir, one))]
        # 16 bytes at interval 512: 1 / (1 - (1 - 1/512)^16) = 32.5 each.
        if vals != [[325, 5120, 325, 5120]]:
            failures.append("pid 200 dump 1 values: %r" % vals)
    for f in failures:
        sys.stderr.write("FAIL: %s\n" % f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
