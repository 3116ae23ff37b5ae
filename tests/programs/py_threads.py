# tests/programs/py_threads.py: 4 threads each make 100 bytearrays of 7000 bytes in
# thread_work; the test counts them under that function at interval 1.
import threading
import time

keep = []
lock = threading.Lock()


def thread_work(n):
    mine = [None] * n
    for i in range(n):
        mine[i] = bytearray(7000)  # thread site
    with lock:
        keep.extend(mine)


threads = [threading.Thread(target=thread_work, args=(100,)) for _ in range(4)]
for t in threads:
    t.start()
for t in threads:
    t.join()
time.sleep(0.3)
print("kept", len(keep))
