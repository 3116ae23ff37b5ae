# tests/bench/workload_python.py: a dict/list/str-heavy Python workload for the overhead
# benchmark (scripts/bench/bench_overhead.sh). Usage: python3 workload_python.py [N]
import sys

n = int(sys.argv[1]) if len(sys.argv) > 1 else 200000
words = ["w%d-%s" % (i, "x" * (i % 37)) for i in range(n)]
index = {}
for i, w in enumerate(words):
    index.setdefault(w[:4], []).append(i)
counts = {}
for w in words:
    key = w.upper()[-6:]
    counts[key] = counts.get(key, 0) + len(w)
pairs = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
text = " ".join(w for w, _ in pairs[:5000])
parts = [p.replace("X", "y") for p in text.split(" ")]
records = [{"id": i, "name": words[i], "tags": [words[i][:2], str(i % 10)]} for i in range(0, n, 3)]
total = sum(len(r["name"]) + len(r["tags"]) for r in records)
print("checksum", len(index), len(pairs), len(parts), total)
