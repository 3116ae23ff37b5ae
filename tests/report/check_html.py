#!/usr/bin/env python3
"""tests/report/check_html.py: reads a page of `heapprof html` on stdin (the trace that
tests/report/test_html.c builds in memory), parses its data with the json module and
checks it against what that trace holds.

usage: check_html.py growth | diff | single    (exit status 0 when every check holds)
"""
import json
import re
import sys

HOSTILE = "</script><img src=x onerror=alert(1)>"


def fail(msg):
    sys.exit("check_html: " + msg)


def expect(cond, msg):
    if not cond:
        fail(msg)


class Page:
    def __init__(self, text):
        m = re.search(r'<script type="application/json" id="hp-data">(.*?)</script>', text,
                      re.DOTALL)
        expect(m, "no data element")
        self.d = json.loads(m.group(1))
        d = self.d
        expect(len(d["frames"]) % 6 == 0, "frames are not rows of 6")
        expect(len(d["np"]) == len(d["nf"]), "np and nf differ in length")
        self.parent = [i - x for i, x in enumerate(d["np"])]
        expect(all(0 <= p < i for i, p in enumerate(self.parent) if i), "a parent after its child")

    def frame(self, f):
        row = self.d["frames"][f * 6:f * 6 + 6]
        s = self.d["strings"]
        return {"name": s[row[0]], "file": s[row[1]], "line": row[2], "module": s[row[3]],
                "pc": row[4], "inlined": bool(row[5] & 1)}

    def path(self, leaf):
        """The frames of the stack ending at trie node @leaf, root first."""
        out = []
        while leaf:
            out.append(self.frame(self.d["nf"][leaf]))
            leaf = self.parent[leaf]
        return out[::-1]

    def names(self, leaf):
        return [f["name"] for f in self.path(leaf)]


def check_common(page):
    d = page.d
    expect(HOSTILE in d["strings"], "the hostile name is not read back as it was")
    expect("other\ufffd\u2028" in d["strings"], "invalid UTF-8 not replaced: %r" % d["strings"])
    expect("app+0x99" in d["strings"], "an unnamed frame is not module+offset")
    p = d["processes"][0]
    expect(p["pid"] == 42 and p["cmd"] == "app --serve", "process header")
    expect(p["flags"]["buffer_overran"] and not p["flags"]["hit_guardrail"], "flags")
    expect(p["losses"]["records_dropped"] == 7, "losses")
    expect(p["stats"]["samples"] == 90, "samples")
    return p


def values(page, dump):
    v = dump["v"]
    return {tuple(page.names(s)): (u, a) for s, u, a in zip(v["s"], v["u"], v["a"])}


def check_growth(page):
    p = check_common(page)
    expect(len(p["dumps"]) == 3 and p["sel"] == 2, "dumps")
    expect([x["u"] for x in p["dumps"]] == [1500, 2500, 3500], "dump totals")
    expect([x["t"] for x in p["dumps"]] == [0, 1, 2], "dump times")
    a = ("main", HOSTILE, "leaf", "outer_inl", "inner_inl")
    last = values(page, p["dumps"][2])
    expect(last == {a: (3000, 3000), ("main", "other\ufffd\u2028"): (0, 4000),
                    ("main", "app+0x99"): (500, 500)}, "last dump: %r" % last)
    expect(values(page, p["dumps"][0])[a] == (1000, 1000), "first dump")
    leaf = p["dumps"][2]["v"]["s"][0]
    path = page.path(leaf)
    expect([f["inlined"] for f in path] == [False, False, False, True, True], "inlined flags")
    expect([(f["file"], f["line"]) for f in path[2:]] ==
           [("app.c", 12), ("inl.h", 3), ("inl.h", 7)], "inlined lines")
    g = p["growth"]
    expect(g["timed"] and g["x"] == [0, 1, 2] and g["total"] == [1500, 2500, 3500], "growth")
    expect(len(g["sites"]) == 1, "growth sites: %r" % g["sites"])
    s = g["sites"][0]
    expect(tuple(page.names(s["s"])) == a and abs(s["slope"] - 1000) < 1e-6 and s["last"] == 3000,
           "growth site")
    expect("diff" not in p, "a diff without a base")


def check_diff(page):
    p = check_common(page)
    expect("diff" in p, "no diff")
    df = p["diff"]
    expect(df["base"]["pid"] == 41, "base process")
    names = [tuple(page.names(s)) for s in df["s"]]
    expect(names[0] == ("main", HOSTILE, "leaf", "outer_inl", "inner_inl"), "diff order")
    expect(names[1] == ("main", "app+0x99"), "diff order")
    expect(df["du"] == [2000, 500, 0] and df["bu"] == [1000, 0, 0] and df["tu"] == [3000, 500, 0],
           "unreleased changes: %r" % df)
    expect(df["da"] == [2000, 500, 0] and df["dc"] == [20, 5, 0], "allocated changes")


def check_single(page):
    p = check_common(page)
    expect(len(p["dumps"]) == 1 and p["sel"] == 0 and p["dumps"][0]["v"], "the selected dump")
    expect("growth" not in p, "growth from one dump")
    q = page.d["processes"][1]
    expect(q["pid"] == 7 and q["dumps"] == [], "a process without dumps")


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    page = Page(sys.stdin.read())
    {"growth": check_growth, "diff": check_diff, "single": check_single}[sys.argv[1]](page)


if __name__ == "__main__":
    main()
