# tests/programs/py_numpy.py: numpy (a C extension) calls back into Python: np_callback
# allocates under numpy's frames, under np_outer.
import time

import numpy as np

keep = []


def np_callback(x):
    keep.append(bytearray(8000))  # numpy site
    return x


def np_outer():
    f = np.frompyfunc(np_callback, 1, 1)
    f(np.arange(30))


np_outer()
time.sleep(0.3)
print("kept", len(keep))
