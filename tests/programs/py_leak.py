# tests/programs/py_leak.py: a Python program that keeps 200 bytearrays of 10000 bytes
# (malloc'd: larger than pymalloc's objects) made in leaky_append, called from outer.
# It sleeps a little before leaving with os._exit (nothing freed at exit), so that the
# profiler reads its records while it is alive.
import os
import sys
import time

keep = []


def leaky_append(n):
    for _ in range(n):
        keep.append(bytearray(10000))  # leak site


def outer():
    leaky_append(200)


outer()
time.sleep(0.3)
print("kept", len(keep))
sys.stdout.flush()
os._exit(0)
