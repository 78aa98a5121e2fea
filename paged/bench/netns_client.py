"""A client that runs inside the driver's network namespace (``ip netns exec NS python netns_client.py``).

The server listens on 127.0.0.1 of its namespace, which the calling process
cannot reach; this script can. It takes ``PORT`` and a JSON list of
completion bodies, sends them all at once (one thread each), and prints one
JSON line per event, flushed at once so the caller can act mid-stream:

    {"i": 3, "event": "first"}                              a stream's first token arrived
    {"i": 3, "event": "end", "status": 200, "text": "...", "tokens": 12, "done": true, "error": null}

``tokens`` counts the streamed chunks that carried text, ``done`` whether
``data: [DONE]`` came, ``error`` the message of an error event or body.
Standard library only: it starts in well under a second. The caller's side
(the two-host test, ``python -m paged.bench tp_network``) is ``StreamClient``,
which starts it and hands over its events as they come, and ``wait_healthy``.
"""

import http.client
import json
import queue
import subprocess
import sys
import threading
import time
from pathlib import Path

TIMEOUT_S = 300  # any one socket read (a loaded 2-core machine); the test bounds the whole run as well

_print_lock = threading.Lock()


def emit(**fields) -> None:
    with _print_lock:
        print(json.dumps(fields), flush=True)


def one(port: int, i: int, body: dict) -> None:
    end = {"i": i, "event": "end", "status": None, "text": "", "tokens": 0, "done": False, "error": None}
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=TIMEOUT_S)
        conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
        r = conn.getresponse()
        end["status"] = r.status
        if not body.get("stream") or r.status != 200:
            data = json.loads(r.read())
            if "error" in data:
                end["error"] = data["error"]["message"]
            else:
                end["text"], end["done"] = data["choices"][0]["text"], True
                end["tokens"] = data["usage"]["completion_tokens"]
        else:
            for raw in r:
                line = raw.decode().strip()
                if not line.startswith("data: "):
                    continue
                if line == "data: [DONE]":
                    end["done"] = True
                    break
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    end["error"] = chunk["error"]["message"]
                    continue
                text = chunk["choices"][0]["text"]
                if text:
                    if end["tokens"] == 0:
                        emit(i=i, event="first")
                    end["tokens"] += 1
                    end["text"] += text
    except Exception as exc:  # a broken connection is an outcome the test judges, not a crash of the client
        end["error"] = end["error"] or f"client: {type(exc).__name__}: {exc}"
    emit(**end)


def main() -> None:
    port, bodies = int(sys.argv[1]), json.loads(sys.argv[2])
    threads = [threading.Thread(target=one, args=(port, i, b)) for i, b in enumerate(bodies)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


# -- the caller's side ------------------------------------------------------------------
def wait_healthy(hosts, port: int, procs: list[subprocess.Popen], timeout_s: float) -> None:
    """Wait until ``GET /health`` on ``port`` of host A answers 200 (``hosts``: a ``netns.TwoHosts``).

    Raises:
        RuntimeError: one of ``procs`` (the server's processes) exited first, or ``timeout_s`` passed.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        for p in procs:
            if p.poll() is not None:
                raise RuntimeError(f"{' '.join(map(str, p.args[-12:]))} exited with {p.returncode} during start-up")
        if health_status(hosts, port) == 200:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"the server on port {port} was not healthy after {timeout_s:.0f} s")
        time.sleep(0.5)


def health_status(hosts, port: int) -> int | None:
    """The status ``GET /health`` on ``port`` of host A answers (200, 503), or None if nothing answers."""
    code = ("import urllib.request as u, urllib.error as e\n"
            f"try: print(u.urlopen('http://127.0.0.1:{port}/health', timeout=2).status)\n"
            "except e.HTTPError as x: print(x.code)\n"
            "except OSError: print('')")
    out = subprocess.run([*hosts.prefix("a"), sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=30).stdout.strip()
    return int(out) if out.isdigit() else None


class JsonLines:
    """The JSON lines ``proc`` prints, as they come (a reader thread); each gets ``"t"``, its arrival's
    ``time.monotonic()``."""

    def __init__(self, proc: subprocess.Popen, timeout_s: float, name: str) -> None:
        self.proc, self.timeout_s, self.name = proc, timeout_s, name
        self.events: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.events.put({**json.loads(line), "t": time.monotonic()})

    def next(self, timeout: float | None = None) -> dict:
        """The next line; ``TimeoutError`` when none comes within ``timeout`` (default: ``timeout_s``)."""
        timeout = self.timeout_s if timeout is None else timeout
        try:
            return self.events.get(timeout=timeout)
        except queue.Empty:
            raise TimeoutError(f"{self.name} printed nothing for {timeout:.0f} s") from None


class StreamClient(JsonLines):
    """This script in host A of ``hosts`` (a ``netns.TwoHosts``), sending ``bodies`` to ``port``."""

    def __init__(self, hosts, bodies: list[dict], port: int, timeout_s: float, env: dict | None = None) -> None:
        super().__init__(hosts.popen("a", [sys.executable, str(Path(__file__).resolve()), str(port),
                                           json.dumps(bodies)], stdout=subprocess.PIPE, text=True, env=env),
                         timeout_s, "the client")
        self.n = len(bodies)

    def wait_first(self, count: int) -> None:
        """Wait until ``count`` streams sent their first token (``RuntimeError`` if one ends first)."""
        started: set[int] = set()
        while len(started) < count:
            e = self.next()
            if e["event"] != "first":
                raise RuntimeError(f"a stream ended before every stream started: {e}")
            started.add(e["i"])

    def results(self) -> list[dict]:
        """Every request's ``end`` event, in the order of ``bodies``, once all have ended."""
        ended: dict[int, dict] = {}
        while len(ended) < self.n:
            e = self.next()
            if e["event"] == "end":
                ended[e["i"]] = e
        self.proc.wait(30)
        return [ended[i] for i in range(self.n)]


if __name__ == "__main__":
    main()
