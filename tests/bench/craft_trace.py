#!/usr/bin/env python3
"""tests/bench/craft_trace.py: writes crafted heap-profile traces for the reader's
benchmarks and tests.

  craft_trace.py a11 N   one interned 4096-frame callstack and N process dumps of one
                         sample each (safety review, reproducer A11): 28 KB for N = 2000
"""
import sys


def varint(v):
    out = b""
    while True:
        b, v = v & 0x7F, v >> 7
        if v:
            out += bytes([b | 0x80])
        else:
            return out + bytes([b])


def fv(num, v):
    return varint(num << 3) + varint(v)


def fl(num, b):
    return varint(num << 3 | 2) + varint(len(b)) + b


def a11(n):
    frames = b"".join(varint(1) for _ in range(4096))
    interned = fl(7, fv(1, 1) + fl(2, frames))  # InternedData.callstacks
    dumps = b"".join(fl(5, fv(1, pid) + fl(2, fv(1, 1) + fv(2, 4096)))
                     for pid in range(1, n + 1))
    # Trace.packet {trusted_packet_sequence_id, interned_data, profile_packet}
    return fl(1, fv(10, 1) + fl(12, interned) + fl(37, dumps))


def main():
    if len(sys.argv) != 3 or sys.argv[1] != "a11":
        sys.exit(__doc__)
    sys.stdout.buffer.write(a11(int(sys.argv[2])))


if __name__ == "__main__":
    main()
