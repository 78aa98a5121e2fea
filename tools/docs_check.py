"""Open every page of the built site in headless Chromium, offline, as a reader would.

    python tools/docs_check.py site build/docs-check      # what `make docs-check` runs

The site is served on loopback; Chromium resolves no other host, so a page that
needs the network fails here as it would for a reader without one. For each page
it reports:

* a console error or an uncaught exception;
* a failed request (an HTTP error, a missing file, a blocked host);
* a formula that did not render (an arithmatex element or a KaTeX error left);
* raw TeX in the visible text (``\\(``, ``$$``, ``\\frac`` …, outside code);
* a broken image (not loaded, or zero width);
* quoted code rendered as prose: a paragraph holding a line of Python (``def …(``,
  ``class …:``, ``import …``) or a snippet marker ``--8<--`` — an include without its
  code fence;
* a list swallowed by a paragraph: a paragraph with a line that starts a list item
  (``- …``, ``* …``, ``1. …``), which happens when a list follows a paragraph with no
  blank line, or a list item's continuation is indented less than four spaces.

Each page's height at 1280 px wide is in the report (a learner page should stay
under about 8 000 px).

It writes one full-page screenshot per page (but the ``source/`` pages of repository
files, each one code block; a page taller than ``MAX_SCREENSHOT_HEIGHT`` in several,
``name.png``, ``name.2.png``, ...: ``screenshot_tiles``) and ``report.txt`` into the output
folder, prints the report, and exits 1 if any page has a problem. Chromium is
driven through its DevTools protocol over a websocket (``websocket-client``).
"""

from __future__ import annotations

import base64
import functools
import http.server
import json
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import websocket

CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--no-first-run", "--hide-scrollbars",
                  "--window-size=1280,900", "--remote-debugging-port=0",
                  "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1"]
MAX_SCREENSHOT_HEIGHT = 16000  # px; Chromium cannot capture much taller pages in one image

# Run in the page after it loaded: what a reader would see wrong, as JSON.
PAGE_PROBE = r"""
(() => {
  const images = [...document.images].filter(i => !i.complete || i.naturalWidth === 0)
                                     .map(i => i.getAttribute("src"));
  const unrendered = [...document.querySelectorAll(".arithmatex, .katex-error, .katex-pending")]
                       .map(e => e.textContent.slice(0, 80));
  const body = document.body.cloneNode(true);
  body.querySelectorAll("pre, code, .katex, script, style").forEach(e => e.remove());
  const text = body.textContent;
  const tex = /\\[()\[\]]|\$\$|\\(frac|sum|max|mathrm|mathbf|text|sqrt|left|right|cdot|dots|lceil|top)\b|Math Processing Error/g;
  const raw = [...text.matchAll(tex)].slice(0, 5).map(m => text.slice(Math.max(0, m.index - 30), m.index + 30));
  // Paragraphs as markdown left them (code spans included): Python or a list marker at the
  // start of a line means a fence or a blank line was missing in the source.
  const paragraphs = [...document.querySelectorAll(".md-content p")]
                       .filter(p => !p.closest("pre, code, .highlight, .jp-OutputArea"));
  const code = /^\s*((async\s+)?def\s+\w+\s*\(|class\s+\w+\s*[(:]|from\s+[\w.]+\s+import\s|import\s+[\w.]+\s*$|@[\w.]+\s*$)|--8<--/m;
  const listItem = /\n\s*([-*+]|\d+[.)])\s+\S/;
  const unfenced = paragraphs.filter(p => code.test(p.textContent)).map(p => p.textContent.trim().slice(0, 60));
  const swallowed = paragraphs.filter(p => listItem.test(p.textContent))
                      .map(p => { const t = p.textContent, i = t.search(listItem);
                                  return t.slice(Math.max(0, i - 30), i + 30).replace(/\s+/g, " "); });
  return JSON.stringify({images, unrendered, raw, unfenced, swallowed,
                         height: document.documentElement.scrollHeight});
})()
"""


class DevTools:
    """A minimal Chrome DevTools Protocol client: commands by id, events kept in order."""

    def __init__(self, url: str):
        self.ws = websocket.create_connection(url, timeout=60, suppress_origin=True)
        self.next_id = 0
        self.events: list[dict] = []

    def send(self, method: str, **params) -> dict:
        """Run one command and return its result (events that arrive meanwhile are kept)."""
        self.next_id += 1
        self.ws.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        while True:
            message = json.loads(self.ws.recv())
            if message.get("id") == self.next_id:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message["result"]
            self.events.append(message)

    def wait_for(self, method: str, timeout: float = 30.0) -> None:
        """Read events until ``method`` arrives."""
        deadline = time.monotonic() + timeout
        while not any(e.get("method") == method for e in self.events):
            if time.monotonic() > deadline:
                raise TimeoutError(f"no {method} within {timeout} s")
            self.events.append(json.loads(self.ws.recv()))

    def settle(self, quiet: float = 0.5) -> None:
        """Read events until none arrives for ``quiet`` seconds (late requests, fonts)."""
        self.ws.settimeout(quiet)
        try:
            while True:
                self.events.append(json.loads(self.ws.recv()))
        except websocket.WebSocketTimeoutException:
            pass
        finally:
            self.ws.settimeout(60)


def serve(site: Path) -> http.server.ThreadingHTTPServer:
    """Serve ``site`` on 127.0.0.1 (a free port) in a background thread, silently."""

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0),
                                             functools.partial(Quiet, directory=str(site)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def start_chromium(profile: Path) -> tuple[subprocess.Popen, str]:
    """Start headless Chromium; return the process and the websocket URL of its page."""
    process = subprocess.Popen(["chromium", *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "about:blank"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    port_file = profile / "DevToolsActivePort"
    for _ in range(300):
        if port_file.exists() and port_file.read_text().strip():
            break
        time.sleep(0.1)
    else:
        process.kill()
        raise RuntimeError("Chromium did not start (no DevToolsActivePort after 30 s)")
    port = port_file.read_text().split()[0]
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list") as response:
        pages = [t for t in json.load(response) if t["type"] == "page"]
    return process, pages[0]["webSocketDebuggerUrl"]


def problems_in_events(events: list[dict]) -> list[str]:
    """Console errors, exceptions and failed requests among a page's DevTools events."""
    found, urls = [], {}
    for event in events:
        method, params = event.get("method"), event.get("params", {})
        if method == "Network.requestWillBeSent":
            urls[params["requestId"]] = params["request"]["url"]
        elif method == "Runtime.exceptionThrown":
            found.append(f"exception: {params['exceptionDetails'].get('text', '')} "
                         f"{params['exceptionDetails'].get('exception', {}).get('description', '')}")
        elif method == "Runtime.consoleAPICalled" and params["type"] in ("error", "assert"):
            found.append("console error: " + " ".join(str(a.get("value", a.get("description", "")))
                                                      for a in params["args"]))
        elif method == "Log.entryAdded" and params["entry"]["level"] == "error":
            entry = params["entry"]
            found.append(f"console error: {entry['text']} {entry.get('url', '')}".rstrip())
        elif method == "Network.loadingFailed" and not params.get("canceled"):
            found.append(f"failed request: {params['errorText']} {urls.get(params['requestId'], '')}")
        elif method == "Network.responseReceived" and params["response"]["status"] >= 400:
            found.append(f"failed request: HTTP {params['response']['status']} {params['response']['url']}")
    return found


def check_page(tab: DevTools, url: str, screenshot: Path | None) -> tuple[list[str], int]:
    """Load one page, collect its problems, save its screenshot (unless None); return them and its height."""
    tab.events.clear()
    tab.send("Page.navigate", url=url)
    tab.wait_for("Page.loadEventFired")
    tab.settle()
    found = problems_in_events(tab.events)
    probe = json.loads(tab.send("Runtime.evaluate", expression=PAGE_PROBE, returnByValue=True)["result"]["value"])
    found += [f"broken image: {src}" for src in probe["images"]]
    found += [f"formula not rendered: {text!r}" for text in probe["unrendered"]]
    found += [f"raw TeX in the text: {text!r}" for text in probe["raw"]]
    found += [f"code outside a code block (an include or snippet without its fence?): {text!r}"
              for text in probe["unfenced"]]
    found += [f"a list swallowed by a paragraph (no blank line before it, or its item "
              f"indented < 4 spaces?): {text!r}" for text in probe["swallowed"]]
    if screenshot is None:
        return found, probe["height"]
    for path, top, height in screenshot_tiles(screenshot, probe["height"]):
        shot = tab.send("Page.captureScreenshot", format="png", captureBeyondViewport=True,
                        clip={"x": 0, "y": top, "width": 1280, "height": height, "scale": 1})
        path.write_bytes(base64.b64decode(shot["data"]))
    return found, probe["height"]


def screenshot_tiles(screenshot: Path, page_height: int) -> list[tuple[Path, int, int]]:
    """``(file, top, height)`` of each image of a page ``page_height`` px tall: one image up to
    ``MAX_SCREENSHOT_HEIGHT``, below that the next (``name.2.png``, ``name.3.png``, ...), so the end of
    a long page is looked at too."""
    height = max(page_height, 1)  # an empty page is still one (1 px) image
    return [(screenshot if part == 0 else screenshot.with_name(f"{screenshot.stem}.{part + 1}{screenshot.suffix}"),
             top, min(MAX_SCREENSHOT_HEIGHT, height - top))
            for part, top in enumerate(range(0, height, MAX_SCREENSHOT_HEIGHT))]


def main(site: str = "site", out: str = "build/docs-check") -> int:
    site_dir, out_dir = Path(site), Path(out)
    pages = sorted(p.relative_to(site_dir) for p in site_dir.rglob("*.html"))
    if not pages:
        print(f"no pages in {site_dir}: build the site first (make docs)")
        return 1
    out_dir.mkdir(parents=True, exist_ok=True)
    server = serve(site_dir)
    base = f"http://127.0.0.1:{server.server_address[1]}/"
    report, total = [], 0
    with tempfile.TemporaryDirectory() as profile:
        process, ws_url = start_chromium(Path(profile))
        try:
            tab = DevTools(ws_url)
            for domain in ("Page", "Runtime", "Log", "Network"):
                tab.send(f"{domain}.enable")
            for page in pages:
                name = page.as_posix().removesuffix("index.html").strip("/") or "home"
                # a repository file's page (tools/mkdocs_sources.py) is one code block: checked, not pictured
                shot = None if name.startswith("source/") else out_dir / f"{name.replace('/', '_')}.png"
                found, height = check_page(tab, base + page.as_posix(), shot)
                total += len(found)
                report.append(f"{'ok  ' if not found else 'FAIL'} {page.as_posix():<48} {height:>6} px"
                              + "".join(f"\n       {p}" for p in found))
        finally:
            process.terminate()
            process.wait(timeout=30)
            server.shutdown()
    report.append(f"{len(pages)} pages, {total} problems; screenshots in {out_dir}/")
    text = "\n".join(report)
    (out_dir / "report.txt").write_text(text + "\n")
    print(text)
    return 1 if total else 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
