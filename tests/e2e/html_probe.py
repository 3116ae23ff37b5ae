#!/usr/bin/env python3
"""tests/e2e/html_probe.py: opens a page of `heapprof html` in headless Chromium and
evaluates JavaScript in it, as a user's browser runs it.

  html_probe.py PAGE.html [--screenshot | --save PNG] [--wait-ms N] NAME=EXPR ...

Chromium runs with the network off (an unreachable proxy, no name resolution, and
DevTools' offline mode) and a fresh profile directory, and is driven over
--remote-debugging-pipe (DevTools protocol on fds 3 and 4, NUL-separated JSON). The
page is loaded from disk; once it has drawn (body[data-ready]) each EXPR is evaluated in
order (a promise is awaited) and printed as "NAME <json value>". Then:

  screenshot W H COLORS    with --screenshot: the PNG's size and how many colours it has
  error TEXT               each console error, exception or error log entry (one line)
  done                     the end

Exit status: 0 when the page loaded (errors are the caller's to judge), 1 when it did
not, 77 when Chromium is not installed (meson's skip code).
"""
import base64
import fcntl
import json
import os
import select
import shutil
import subprocess
import sys
import tempfile
import time
import zlib

TIMEOUT_S = 30


class Browser:
    def __init__(self, exe):
        self.profile = tempfile.mkdtemp(prefix="heapprof-probe-")
        cmd_r, self.cmd_w = os.pipe()
        self.res_r, res_w = os.pipe()

        def child_fds():
            # Out of the way first: either end may already be fd 3 or 4.
            a = fcntl.fcntl(cmd_r, fcntl.F_DUPFD, 10)
            b = fcntl.fcntl(res_w, fcntl.F_DUPFD, 10)
            os.dup2(a, 3)
            os.dup2(b, 4)

        args = [exe, "--headless=new", "--no-sandbox", "--disable-gpu",
                "--remote-debugging-pipe", "--user-data-dir=" + self.profile,
                "--no-first-run", "--no-default-browser-check", "--disable-extensions",
                "--disable-background-networking", "--disable-component-update",
                "--disable-sync", "--disable-default-apps", "--mute-audio",
                "--proxy-server=127.0.0.1:9", "--host-resolver-rules=MAP * ~NOTFOUND",
                "--window-size=1280,900", "about:blank"]
        self.proc = subprocess.Popen(args, preexec_fn=child_fds, pass_fds=(3, 4),
                                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)
        os.close(cmd_r)
        os.close(res_w)
        self.buf = b""
        self.next_id = 0
        self.events = []
        self.session = None

    def close(self):
        try:
            self.send("Browser.close", session=False)
        except OSError:
            pass
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self.cmd_w)
        os.close(self.res_r)
        shutil.rmtree(self.profile, ignore_errors=True)

    def send(self, method, params=None, session=True):
        self.next_id += 1
        msg = {"id": self.next_id, "method": method, "params": params or {}}
        if session and self.session:
            msg["sessionId"] = self.session
        os.write(self.cmd_w, json.dumps(msg).encode() + b"\0")
        return self.next_id

    def read_message(self, deadline):
        while b"\0" not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("no answer from chromium")
            ready, _, _ = select.select([self.res_r], [], [], left)
            if ready:
                chunk = os.read(self.res_r, 1 << 20)
                if not chunk:
                    raise EOFError("chromium closed the pipe")
                self.buf += chunk
        msg, self.buf = self.buf.split(b"\0", 1)
        return json.loads(msg)

    def call(self, method, params=None, session=True, timeout=TIMEOUT_S):
        mid = self.send(method, params, session)
        deadline = time.monotonic() + timeout
        while True:
            msg = self.read_message(deadline)
            if msg.get("id") == mid:
                if "error" in msg:
                    raise RuntimeError("%s: %s" % (method, msg["error"]))
                return msg.get("result", {})
            if "method" in msg:
                self.events.append(msg)

    def wait_event(self, name, timeout=TIMEOUT_S):
        deadline = time.monotonic() + timeout
        for i, ev in enumerate(self.events):
            if ev["method"] == name:
                del self.events[i]
                return ev
        while True:
            msg = self.read_message(deadline)
            if msg.get("method") == name:
                return msg
            if "method" in msg:
                self.events.append(msg)

    def evaluate(self, expr):
        r = self.call("Runtime.evaluate", {"expression": expr, "returnByValue": True,
                                           "awaitPromise": True})
        if "exceptionDetails" in r:
            d = r["exceptionDetails"]
            text = d.get("exception", {}).get("description") or d.get("text")
            raise RuntimeError("evaluating %r: %s" % (expr, text))
        return r["result"].get("value")


def errors_of(events):
    out = []
    for ev in events:
        m, p = ev["method"], ev.get("params", {})
        if m == "Runtime.exceptionThrown":
            d = p.get("exceptionDetails", {})
            out.append("exception: " + str(d.get("exception", {}).get("description")
                                           or d.get("text")))
        elif m == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
            out.append("console.%s: %s" % (p["type"], " ".join(
                str(a.get("value", a.get("description"))) for a in p.get("args", []))))
        elif m == "Log.entryAdded" and p.get("entry", {}).get("level") == "error":
            out.append("log: " + p["entry"].get("text", ""))
    return [" ".join(e.split()) for e in out]


def png_colors(png):
    """Width, height and number of distinct pixel values of an 8-bit RGB(A) PNG."""
    if png[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError("not a PNG")
    pos, idat, w, h, ctype = 8, b"", 0, 0, 0
    while pos < len(png):
        n = int.from_bytes(png[pos:pos + 4], "big")
        kind, body = png[pos + 4:pos + 8], png[pos + 8:pos + 8 + n]
        if kind == b"IHDR":
            w, h = int.from_bytes(body[0:4], "big"), int.from_bytes(body[4:8], "big")
            if body[8] != 8 or body[9] not in (2, 6) or body[12] != 0:
                raise ValueError("unexpected PNG format")
            ctype = body[9]
        elif kind == b"IDAT":
            idat += body
        pos += 12 + n
    bpp = 4 if ctype == 6 else 3
    raw = zlib.decompress(idat)
    stride = w * bpp
    prev = bytearray(stride)
    colors = set()
    for y in range(h):
        f = raw[y * (stride + 1)]
        line = bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b = prev[i]
            c = prev[i - bpp] if i >= bpp else 0
            if f == 1:
                line[i] = (line[i] + a) & 0xFF
            elif f == 2:
                line[i] = (line[i] + b) & 0xFF
            elif f == 3:
                line[i] = (line[i] + (a + b) // 2) & 0xFF
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                pr = a if pa <= pb and pa <= pc else b if pb <= pc else c
                line[i] = (line[i] + pr) & 0xFF
        if y % 4 == 0:  # every 4th row is enough to tell a blank page
            colors.update(bytes(line[i:i + bpp]) for i in range(0, stride, bpp * 2))
        prev = line
    return w, h, len(colors)


def main():
    args = sys.argv[1:]
    if not args or args[0].startswith("-"):
        sys.exit(__doc__)
    page, shot, wait_ms, exprs = os.path.abspath(args[0]), False, 0, []
    i = 1
    while i < len(args):
        if args[i] == "--screenshot":
            shot = True
        elif args[i] == "--save":
            i += 1
            shot = args[i]
        elif args[i] == "--wait-ms":
            i += 1
            wait_ms = int(args[i])
        else:
            name, _, expr = args[i].partition("=")
            exprs.append((name, expr))
        i += 1
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if not exe:
        print("chromium is not installed (scripts/install-deps.sh installs it)")
        sys.exit(77)
    b = Browser(exe)
    try:
        targets = b.call("Target.getTargets", session=False)["targetInfos"]
        page_id = next(t["targetId"] for t in targets if t["type"] == "page")
        b.session = b.call("Target.attachToTarget", {"targetId": page_id, "flatten": True},
                           session=False)["sessionId"]
        for domain in ("Runtime", "Log", "Page", "Network"):
            b.call(domain + ".enable")
        b.call("Network.emulateNetworkConditions", {"offline": True, "latency": 0,
                                                    "downloadThroughput": -1,
                                                    "uploadThroughput": -1})
        b.call("Page.navigate", {"url": "file://" + page})
        b.wait_event("Page.loadEventFired")
        b.evaluate("new Promise(ok => { const f = () => document.body && "
                   "document.body.hasAttribute('data-ready') ? ok(1) : setTimeout(f, 10); f(); })")
        if wait_ms:
            time.sleep(wait_ms / 1000)
        for name, expr in exprs:
            print(name, json.dumps(b.evaluate(expr)), flush=True)
        if shot:
            png = base64.b64decode(b.call("Page.captureScreenshot", {"format": "png"})["data"])
            print("screenshot %d %d %d" % png_colors(png))
            if shot is not True:
                with open(shot, "wb") as f:
                    f.write(png)
        b.evaluate("1")  # collects the events still in flight
        for e in errors_of(b.events):
            print("error", e)
        print("done")
    except (RuntimeError, TimeoutError, EOFError, StopIteration, ValueError) as e:
        for err in errors_of(b.events):
            print("error", err)
        print("probe failed:", " ".join(str(e).split()))
        sys.exit(1)
    finally:
        b.close()


if __name__ == "__main__":
    main()
