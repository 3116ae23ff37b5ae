# tests/programs/py_exact.py: exactly 300 allocations of 5001 bytes (bytearray(5000)'s
# buffer, from malloc) in exact_sites, at one line; the test records it at interval 1.
import time

N = 300
keep = [None] * N


def exact_sites():
    for i in range(N):
        keep[i] = bytearray(5000)  # exact site


exact_sites()
time.sleep(0.3)
print("made", len(keep))
