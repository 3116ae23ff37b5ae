# tests/programs/py_freed.py: a function whose code object is freed before the profiler
# reads the samples it made. Writes the file READY once running, waits for the file GO,
# then compiles make_freed (its own code object, in file py_freed_gen.py, line 5 for its
# "out.append" line), runs it to make N bytearrays of 600 bytes, drops it (the code object
# is freed at once: the function and its globals only hold each other) and exits. The test
# stops the service between READY and GO, so every record of the run is read after the
# code object and the process are gone; the frame must be named all the same.
import os
import sys
import time

N = 50
SRC = "\n\ndef make_freed(n, out):\n    for _ in range(n):\n        out.append(bytearray(600))\n"

ready, go = sys.argv[1], sys.argv[2]
open(ready, "w").close()
while not os.path.exists(go):
    time.sleep(0.01)
keep = []
ns = {}
exec(compile(SRC, "py_freed_gen.py", "exec"), ns)
ns["make_freed"](N, keep)
ns.clear()
print("made", len(keep))
