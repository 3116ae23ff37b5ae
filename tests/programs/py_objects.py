# tests/programs/py_objects.py: exactly 500 objects of a small class with __slots__ (48
# bytes each from pymalloc, never from malloc) made in make_points at one line and kept;
# the test records it at interval 1 on the python.objects heap.
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


make_points()
time.sleep(0.3)
print("made", len(keep))
