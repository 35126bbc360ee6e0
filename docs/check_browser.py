#!/usr/bin/env python3
"""Load the built site in headless Chromium and fail on any console error.

    python docs/check_browser.py                      # site/ as built by `python3 run.py docs`
    python docs/check_browser.py --build /tmp/site    # build it there first (mkdocs --strict)
    python docs/check_browser.py --screenshots docs/screenshots

The site is served by ``http.server`` on 127.0.0.1; Chromium (Debian's ``chromium``) runs
headless with ``--remote-debugging-port`` and is driven over the DevTools protocol by the small
standard-library WebSocket client below. For the home page, a guide, an API page and the search
results for "ReplayBuffer" it records every console message of level error, every uncaught
exception and every failed request (``Runtime.consoleAPICalled``, ``Runtime.exceptionThrown``,
``Log.entryAdded``), checks that the page rendered its title and that the search found
ReplayBuffer, and saves one screenshot per page. Exit 0 when every page is clean, 1 otherwise.
"""

from __future__ import annotations

import argparse
import base64
import functools
import http.server
import json
import os
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PAGES = (  # (name, path under the site, text the rendered page must contain)
    ("home", "", "Reinforcement-learning experience"),
    ("guide", "getting-started/", "Reading the run directory"),
    ("api", "reference/api/data/", "ReplayBuffer"),
)


class WebSocket:
    """A minimal RFC 6455 client: text frames out (masked), frames in (any size, fragments)."""

    def __init__(self, url: str, timeout: float = 30.0) -> None:
        assert url.startswith("ws://"), url
        hostport, _, path = url[5:].partition("/")
        host, _, port = hostport.partition(":")
        self.sock = socket.create_connection((host, int(port)), timeout=timeout)
        key = base64.b64encode(os.urandom(16)).decode()
        self.sock.sendall(
            (
                f"GET /{path} HTTP/1.1\r\nHost: {hostport}\r\nUpgrade: websocket\r\n"
                f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
                "Sec-WebSocket-Version: 13\r\n\r\n"
            ).encode()
        )
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = self.sock.recv(4096)
            if not chunk:
                raise ConnectionError("the DevTools endpoint closed during the handshake")
            head += chunk
        if b" 101 " not in head.split(b"\r\n", 1)[0]:
            raise ConnectionError(f"no WebSocket upgrade: {head[:200]!r}")
        self.buf = head.split(b"\r\n\r\n", 1)[1]

    def send(self, text: str) -> None:
        data = text.encode()
        n = len(data)
        header = bytes([0x81])
        if n < 126:
            header += bytes([0x80 | n])
        elif n < 1 << 16:
            header += bytes([0x80 | 126]) + struct.pack(">H", n)
        else:
            header += bytes([0x80 | 127]) + struct.pack(">Q", n)
        mask = os.urandom(4)
        self.sock.sendall(header + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(data)))

    def _read(self, n: int) -> bytes:
        while len(self.buf) < n:
            chunk = self.sock.recv(1 << 20)
            if not chunk:
                raise ConnectionError("the DevTools endpoint closed the connection")
            self.buf += chunk
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def recv(self) -> str:
        parts = []
        while True:
            b0, b1 = self._read(2)
            n = b1 & 0x7F
            if n == 126:
                n = struct.unpack(">H", self._read(2))[0]
            elif n == 127:
                n = struct.unpack(">Q", self._read(8))[0]
            mask = self._read(4) if b1 & 0x80 else None
            data = self._read(n)
            if mask:
                data = bytes(b ^ mask[i % 4] for i, b in enumerate(data))
            if b0 & 0x0F == 0x8:
                raise ConnectionError("the DevTools endpoint sent close")
            if b0 & 0x0F in (0x9, 0xA):  # ping/pong: ignore
                continue
            parts.append(data)
            if b0 & 0x80:
                return b"".join(parts).decode()


class Page:
    """One DevTools page session: commands with their replies, events kept in order."""

    def __init__(self, ws_url: str) -> None:
        self.ws = WebSocket(ws_url)
        self.next_id = 0
        self.events: list[dict[str, Any]] = []

    def call(self, method: str, timeout: float = 60.0, **params: Any) -> dict[str, Any]:
        self.next_id += 1
        self.ws.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            msg = json.loads(self.ws.recv())
            if msg.get("id") == self.next_id:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})
            self.events.append(msg)
        raise TimeoutError(method)

    def wait_event(self, method: str, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        seen = len(self.events)
        while time.monotonic() < deadline:
            if any(e.get("method") == method for e in self.events[seen:]):
                return
            self.events.append(json.loads(self.ws.recv()))
        raise TimeoutError(method)

    def settle(self, seconds: float) -> None:
        """Read events for ``seconds`` (JS that runs after load: search, highlighting)."""
        end = time.monotonic() + seconds
        self.ws.sock.settimeout(0.2)
        try:
            while time.monotonic() < end:
                try:
                    self.events.append(json.loads(self.ws.recv()))
                except TimeoutError:
                    continue
        finally:
            self.ws.sock.settimeout(30)

    def js(self, expression: str) -> Any:
        res = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        return res.get("result", {}).get("value")


def errors(events: list[dict[str, Any]]) -> list[str]:
    """The console errors, uncaught exceptions and failed loads among DevTools events."""
    out = []
    for e in events:
        m, p = e.get("method"), e.get("params", {})
        if m == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
            args = " ".join(str(a.get("value", a.get("description", ""))) for a in p["args"])
            out.append(f"console.{p['type']}: {args}")
        elif m == "Runtime.exceptionThrown":
            d = p.get("exceptionDetails", {})
            out.append(f"exception: {d.get('exception', {}).get('description') or d.get('text')}")
        elif m == "Log.entryAdded" and p.get("entry", {}).get("level") == "error":
            entry = p["entry"]
            out.append(f"log ({entry.get('source')}): {entry.get('text')} {entry.get('url', '')}")
    return out


def serve(site: Path) -> tuple[http.server.ThreadingHTTPServer, str]:
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

    handler = functools.partial(Quiet, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/"


def start_chromium(browser: str, profile: Path) -> tuple[subprocess.Popen, int]:
    args = [
        browser, "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
        "--disable-extensions", "--disable-dev-shm-usage", "--hide-scrollbars",
        f"--user-data-dir={profile}", "--remote-debugging-port=0", "--remote-debugging-address=127.0.0.1",
        "--window-size=1280,900", "about:blank",
    ]  # fmt: skip
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    port_file = profile / "DevToolsActivePort"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if port_file.exists() and port_file.read_text().strip():
            return proc, int(port_file.read_text().split()[0])
        if proc.poll() is not None:
            raise RuntimeError(f"chromium exited with {proc.returncode} before it listened")
        time.sleep(0.1)
    proc.kill()
    raise TimeoutError("chromium did not open its DevTools port within 60 s")


def new_page(port: int) -> Page:
    req = urllib.request.Request(f"http://127.0.0.1:{port}/json/new?about:blank", method="PUT")
    with urllib.request.urlopen(req, timeout=30) as r:
        target = json.loads(r.read())
    page = Page(target["webSocketDebuggerUrl"])
    for domain in ("Page", "Runtime", "Log"):
        page.call(f"{domain}.enable")
    page.call("Emulation.setDeviceMetricsOverride", width=1280, height=900,
              deviceScaleFactor=1, mobile=False)  # fmt: skip
    return page


def visit(page: Page, url: str) -> None:
    page.call("Page.navigate", url=url)
    page.wait_event("Page.loadEventFired")
    page.settle(1.5)


def shoot(page: Page, path: Path | None) -> None:
    if path is None:
        return
    data = page.call("Page.captureScreenshot", format="png")["data"]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(base64.b64decode(data))


SEARCH_JS = """
(() => {
  const toggle = document.querySelector('[data-md-toggle="search"]');
  if (toggle) { toggle.checked = true; toggle.dispatchEvent(new Event('change')); }
  const input = document.querySelector('.md-search__input');
  if (!input) return 'no search input';
  input.focus();
  input.value = 'ReplayBuffer';
  input.dispatchEvent(new Event('focus'));
  input.dispatchEvent(new Event('input', {bubbles: true}));
  input.dispatchEvent(new KeyboardEvent('keyup', {key: 'r', bubbles: true}));
  return 'typed';
})()
"""
RESULTS_JS = """
(() => {
  const items = [...document.querySelectorAll('.md-search-result__item')];
  const meta = document.querySelector('.md-search-result__meta');
  return {count: items.length, meta: meta ? meta.textContent.trim() : '',
          first: items.slice(0, 3).map(i => i.textContent.trim().slice(0, 80))};
})()
"""


def check(site: Path, shots: Path | None, browser: str) -> int:
    server, base = serve(site)
    failed = 0
    with tempfile.TemporaryDirectory() as profile:
        proc, port = start_chromium(browser, Path(profile))
        try:
            for name, path, expect in PAGES:
                page = new_page(port)
                visit(page, base + path)
                title = page.js("document.title") or ""
                text = page.js("document.querySelector('article') ? "
                               "document.querySelector('article').innerText : ''") or ""  # fmt: skip
                bad = errors(page.events)
                ok = not bad and expect in text
                failed += not ok
                print(f"{'ok  ' if ok else 'FAIL'} {name:6} {base + path} title={title!r} "
                      f"console errors={len(bad)}{'' if expect in text else f' (no {expect!r})'}")  # fmt: skip
                for line in bad:
                    print(f"     {line}")
                shoot(page, shots / f"{name}.png" if shots else None)
            page = new_page(port)
            visit(page, base)
            page.js(SEARCH_JS)
            found: dict[str, Any] = {}
            for _ in range(40):  # the search index loads in a web worker
                page.settle(0.25)
                found = page.js(RESULTS_JS) or {}
                if found.get("count"):
                    break
            bad = errors(page.events)
            ok = (
                not bad
                and found.get("count", 0) > 0
                and any("ReplayBuffer" in t for t in found.get("first", []))
            )
            failed += not ok
            print(f"{'ok  ' if ok else 'FAIL'} search 'ReplayBuffer': {found.get('meta')!r}, "
                  f"first results {found.get('first')}, console errors={len(bad)}")  # fmt: skip
            for line in bad:
                print(f"     {line}")
            shoot(page, shots / "search.png" if shots else None)
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            server.shutdown()
    print("browser check:", "passed" if not failed else f"{failed} page(s) failed")
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--site", default=str(ROOT / "site"), help="the built site [default: site/]")
    ap.add_argument("--build", metavar="DIR", help="build the site into DIR first (--strict)")
    ap.add_argument("--screenshots", metavar="DIR", help="save one PNG per page kind here")
    ap.add_argument(
        "--browser", default=shutil.which("chromium") or shutil.which("chromium-browser")
    )
    args = ap.parse_args(argv)
    if not args.browser:
        print("chromium not found: apt-get install -y chromium", file=sys.stderr)
        return 2
    site = Path(args.site)
    if args.build:
        site = Path(args.build)
        cmd = [sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d", str(site)]
        env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
        subprocess.run(cmd, cwd=ROOT, check=True, env=env)
    if not (site / "index.html").exists():
        print(f"{site} has no index.html: build it first (python3 run.py docs)", file=sys.stderr)
        return 2
    return check(site, Path(args.screenshots) if args.screenshots else None, args.browser)


if __name__ == "__main__":
    sys.exit(main())
