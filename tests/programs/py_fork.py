# tests/programs/py_fork.py: a multiprocessing child (fork) makes 50 bytearrays of 9000
# bytes in child_work; the parent waits for it.
import multiprocessing as mp
import os
import time


def child_work(n):
    keep = [None] * n
    for i in range(n):
        keep[i] = bytearray(9000)  # child site
    time.sleep(0.3)
    os._exit(0 if len(keep) == n else 1)


if __name__ == "__main__":
    ctx = mp.get_context("fork")
    p = ctx.Process(target=child_work, args=(50,))
    p.start()
    p.join()
    print("child exit", p.exitcode)
