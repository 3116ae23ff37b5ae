# tests/programs/py_codes.py: 16 functions, each compiled, run and freed in turn, so that
# each one's code object likely takes the block the last one's had; gen_K makes exactly 20
# objects of a small class at its line "out.append(P())", which is line K + 3 of its file
# (py_codes_gen.py): another first line each, so that no two of them look alike to the
# profiler. Each lives a while after its run, for the profiler to read its name. The test
# records it at interval 1 on the python.objects heap and checks that no function is
# credited with another's objects.
import time


class P:
    __slots__ = ("a", "b")


ROUNDS = 16
N = 20
SRC = "def gen_%d(n, out):\n    for _ in range(n):\n        out.append(P())\n"
keep = []
for k in range(ROUNDS):
    ns = {"P": P}
    exec(compile("\n" * k + SRC % k, "py_codes_gen.py", "exec"), ns)
    ns["gen_%d" % k](N, keep)
    time.sleep(0.05)
    ns.clear()  # the function and its globals hold each other: freed now, not by the GC
print("made", len(keep))
