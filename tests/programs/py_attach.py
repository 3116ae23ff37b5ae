# tests/programs/py_attach.py: makes small objects in attach_work until its stdin ends,
# and says which object allocator it saw, in the order seen: pymalloc, then another
# while heapprof attach records python.objects (its wrapper), then pymalloc again once
# the session ended. The test attaches to it for a moment.
import sys
import threading
import time

import _testcapi


class Item:
    __slots__ = ("n",)

    def __init__(self, n):
        self.n = n


def allocator():
    try:
        return _testcapi.pymem_getallocatorsname()
    except RuntimeError:  # not one of CPython's own: wrapped
        return "wrapped"


done = threading.Event()


def watch_stdin():
    sys.stdin.read()
    done.set()


keep = []


def attach_work():
    for i in range(100):
        keep.append(Item(i))  # attach site
    del keep[:-1000]


threading.Thread(target=watch_stdin, daemon=True).start()
states = [allocator()]
print("ready", flush=True)
while not done.is_set():
    attach_work()
    now = allocator()
    if now != states[-1]:
        states.append(now)
    time.sleep(0.002)
print("states", " ".join(states), flush=True)
