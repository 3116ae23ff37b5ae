# tests/programs/py_raise.py: a Python key function called by C code (sorted) allocates
# and raises; the exception goes up through sorted's C frames to raise_through.
import time

keep = []


def key_alloc(x):
    keep.append(bytearray(6000))  # key site
    if x == 3:
        raise ValueError("three")
    return x


def raise_through():
    for _ in range(20):
        try:
            sorted(range(5), key=key_alloc)
        except ValueError:
            pass


raise_through()
time.sleep(0.3)
print("kept", len(keep))
