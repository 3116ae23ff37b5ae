#!/usr/bin/env python3
"""tests/e2e/html_probe_firefox.py: html_probe.py's checks in headless Firefox (Debian's
firefox-esr), so that a page of `heapprof html` is seen working in both browsers.

  html_probe_firefox.py PAGE.html [--screenshot] NAME=EXPR ...

Firefox runs headless with a fresh profile, the network off (a proxy that does not
answer, no captive-portal or update checks) and Marionette on a free local port; the
script speaks Marionette's protocol itself (length-prefixed JSON over TCP: "LEN:JSON").
The page is loaded from disk; once it has drawn (body[data-ready]) each EXPR is
evaluated in order (WebDriver:ExecuteScript, which awaits a promise) and printed as
"NAME <json value>". Errors the page throws or logs are collected by a listener the
script adds and printed as "error TEXT" lines; "screenshot W H COLORS" as html_probe.py
prints it; "done" at the end.

Exit status: 0 when the page loaded, 1 when it did not, 77 when Firefox is not
installed (meson's skip code).
"""
import base64
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from html_probe import png_colors  # noqa: E402

TIMEOUT_S = 40

PREFS = {
    "marionette.port": 0,  # set below
    "network.proxy.type": 1,
    "network.proxy.http": "127.0.0.1",
    "network.proxy.http_port": 9,
    "network.proxy.ssl": "127.0.0.1",
    "network.proxy.ssl_port": 9,
    "network.proxy.no_proxies_on": "",
    "network.captive-portal-service.enabled": False,
    "network.connectivity-service.enabled": False,
    "app.update.disabledForTesting": True,
    "browser.shell.checkDefaultBrowser": False,
    "datareporting.policy.dataSubmissionEnabled": False,
    "toolkit.telemetry.reportingpolicy.firstRun": False,
    "browser.startup.homepage_override.mstone": "ignore",
    "extensions.update.enabled": False,
    "browser.safebrowsing.malware.enabled": False,
    "browser.safebrowsing.phishing.enabled": False,
}


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


class Firefox:
    def __init__(self, exe):
        self.profile = tempfile.mkdtemp(prefix="heapprof-ffprobe-")
        self.port = free_port()
        prefs = dict(PREFS, **{"marionette.port": self.port})
        with open(os.path.join(self.profile, "user.js"), "w") as f:
            for k, v in prefs.items():
                f.write("user_pref(%s, %s);\n" % (json.dumps(k), json.dumps(v)))
        env = dict(os.environ, MOZ_HEADLESS="1")
        self.proc = subprocess.Popen(
            [exe, "--headless", "--marionette", "--no-remote", "--profile", self.profile,
             "--window-size", "1280,900", "about:blank"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            env=env)
        self.sock = None
        deadline = time.monotonic() + TIMEOUT_S
        while self.sock is None:
            try:
                self.sock = socket.create_connection(("127.0.0.1", self.port), timeout=TIMEOUT_S)
            except OSError:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    raise TimeoutError("firefox's Marionette did not listen")
                time.sleep(0.1)
        self.buf = b""
        self.next_id = 0
        self.read_message()  # the greeting

    def read_message(self):
        while True:
            head, sep, rest = self.buf.partition(b":")
            if sep and len(rest) >= int(head):
                n = int(head)
                self.buf = rest[n:]
                return json.loads(rest[:n])
            chunk = self.sock.recv(1 << 20)
            if not chunk:
                raise EOFError("firefox closed the connection")
            self.buf += chunk

    def call(self, command, params=None):
        self.next_id += 1
        body = json.dumps([0, self.next_id, command, params or {}]).encode()
        self.sock.sendall(str(len(body)).encode() + b":" + body)
        while True:
            msg = self.read_message()
            if msg[0] == 1 and msg[1] == self.next_id:
                if msg[2]:
                    raise RuntimeError("%s: %s" % (command, msg[2].get("message", msg[2])))
                return msg[3]

    def evaluate(self, expr):
        r = self.call("WebDriver:ExecuteScript", {"script": "return (" + expr + ");",
                                                  "args": []})
        return r.get("value") if isinstance(r, dict) else r

    def close(self):
        try:
            self.call("Marionette:Quit", {"flags": ["eForceQuit"]})
        except (OSError, RuntimeError, EOFError):
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if self.sock:
            self.sock.close()
        shutil.rmtree(self.profile, ignore_errors=True)


def main():
    args = sys.argv[1:]
    if not args or args[0].startswith("-"):
        sys.exit(__doc__)
    page, shot, exprs = os.path.abspath(args[0]), False, []
    for a in args[1:]:
        if a == "--screenshot":
            shot = True
        else:
            name, _, expr = a.partition("=")
            exprs.append((name, expr))
    exe = shutil.which("firefox-esr") or shutil.which("firefox")
    if not exe:
        print("firefox is not installed (scripts/install-deps.sh installs firefox-esr)")
        sys.exit(77)
    b = None
    try:
        b = Firefox(exe)
        b.call("WebDriver:NewSession", {"capabilities": {"alwaysMatch": {"acceptInsecureCerts": False}}})
        b.call("WebDriver:Navigate", {"url": "file://" + page})
        deadline = time.monotonic() + TIMEOUT_S
        while not b.evaluate("document.body && document.body.hasAttribute('data-ready')"):
            if time.monotonic() > deadline:
                raise TimeoutError("the page never drew (no data-ready)")
            time.sleep(0.05)
        # Errors from here on: exceptions and console.error calls.
        b.evaluate("(window.__hpErrors = [], window.addEventListener('error', e => "
                   "window.__hpErrors.push('exception: ' + e.message)), "
                   "window.__hpLogError = console.error, console.error = (...a) => "
                   "{ window.__hpErrors.push('console.error: ' + a.join(' ')); "
                   "window.__hpLogError(...a); }, 1)")
        for name, expr in exprs:
            print(name, json.dumps(b.evaluate(expr)), flush=True)
        if shot:
            png = base64.b64decode(b.call("WebDriver:TakeScreenshot", {"full": False})["value"])
            print("screenshot %d %d %d" % png_colors(png))
        for e in b.evaluate("window.__hpErrors") or []:
            print("error", " ".join(str(e).split()))
        print("done")
    except (RuntimeError, TimeoutError, EOFError, OSError, ValueError) as e:
        print("probe failed:", " ".join(str(e).split()))
        sys.exit(1)
    finally:
        if b:
            b.close()


if __name__ == "__main__":
    main()
