# tests/programs/py_objects.py: exactly 500 objects of a small class with __slots__ (64
# bytes each from pymalloc, never from malloc) made in make_points at one line and kept;
# the test records it at interval 1 on the python.objects heap. With "fork", a child of
# os.fork() makes them instead, and the parent waits for it.
import os
import sys
import time

N = 500


class Point:
    __slots__ = ("x", "y", "z", "w")

    def __init__(self, x):
        self.x = x
        self.y = None
        self.z = None
        self.w = None


keep = [None] * N


def make_points():
    for i in range(N):
        keep[i] = Point(None)  # object site


if sys.argv[1:] == ["fork"]:
    pid = os.fork()
    if pid == 0:
        make_points()
        time.sleep(0.3)
        os._exit(0 if keep[-1] is not None else 1)
    _, status = os.waitpid(pid, 0)
    print("child exit", os.waitstatus_to_exitcode(status))
else:
    make_points()
    time.sleep(0.3)
    print("made", len(keep))
