"""SIGTERM stops the server gracefully (``paged/serve/shutdown.py``).

A server gets three requests — a short one, which can finish within ``--shutdown-timeout``, and two
long ones, a stream and a plain request, which cannot — and SIGTERM while all three run. Then:

* a new request gets a 503 with ``Retry-After`` (code ``server_shutting_down``), and so does ``/health``;
* the short request finishes normally (200, all its tokens);
* the long plain request gets the stopping server's JSON 503, the long stream an error event with the
  same code followed by ``[DONE]``;
* the process exits with status 0, within the shutdown timeout and a few seconds.

The timeout is sized from the server's measured speed, so that the short request fits in it twice
over and the long ones cannot (20 times more tokens, 3.5 times the timeout).
"""

from __future__ import annotations

import json
import signal
import threading
import time

import httpx

from tests.serve.conftest import Server, server_args

SHORT, LONG = 48, 1000  # tokens (the demo model's context is 1 024)
EXIT_SLACK_S = 15  # after the timeout: the ended requests' answers, uvicorn's shutdown, the engine thread


def body(tokens: int, stream: bool = False) -> dict:
    return {"model": "test-model", "prompt": "def f(x):", "max_tokens": tokens, "ignore_eos": True,
            "temperature": 0, "stream": stream}


def seconds_per_token(url: str) -> float:
    t0 = time.monotonic()
    r = httpx.post(url + "/v1/completions", json=body(64), timeout=120)
    assert r.status_code == 200
    return (time.monotonic() - t0) / 64


def test_sigterm_finishes_what_fits_ends_the_rest_with_an_error_and_exits_0(model_path):
    probe = Server(model_path, server_args())
    try:
        per_token = seconds_per_token(probe.url)
    finally:
        probe.stop()
    # the short request, slowed by 3 running at once, twice over: a long one needs 3.5 times this, so that a
    # probe timed at a busier moment than the run still leaves it unfinished. The floor is for a very fast
    # server, and small (1 s), so that even there a long request needs several times the timeout (3 s let
    # one finish once the demo model decoded at about 3 ms a token)
    timeout = max(1.0, 3 * 2 * SHORT * per_token)
    server = Server(model_path, server_args() + ["--shutdown-timeout", f"{timeout:.1f}"])
    out: dict = {}
    streaming = threading.Event()

    def stream():
        events = []
        with httpx.stream("POST", server.url + "/v1/completions", json=body(LONG, True), timeout=300) as r:
            for line in r.iter_lines():
                if line.startswith("data: "):
                    events.append(line[6:])
                    streaming.set()
        out["stream"] = events

    def plain(name: str, tokens: int):
        out[name] = httpx.post(server.url + "/v1/completions", json=body(tokens), timeout=300)

    threads = [threading.Thread(target=stream), threading.Thread(target=plain, args=("long", LONG)),
               threading.Thread(target=plain, args=("short", SHORT))]
    try:
        for t in threads:
            t.start()
        assert streaming.wait(120)
        time.sleep(0.2)
        t0 = time.monotonic()
        server.proc.send_signal(signal.SIGTERM)
        time.sleep(0.3)
        for refused in (httpx.post(server.url + "/v1/completions", json=body(4), timeout=30),
                        httpx.get(server.url + "/health", timeout=30)):
            assert refused.status_code == 503 and refused.headers["retry-after"], refused.text
            assert refused.json()["error"]["code"] == "server_shutting_down"
        code = server.proc.wait(timeout + EXIT_SLACK_S)
        took = time.monotonic() - t0
        for t in threads:
            t.join(60)
    finally:
        output = server.output()
        server.stop()
    assert code == 0, output
    assert timeout - 0.5 < took < timeout + EXIT_SLACK_S, (took, timeout)
    short = out["short"]
    assert short.status_code == 200 and short.json()["usage"]["completion_tokens"] == SHORT
    long = out["long"]
    assert long.status_code == 503 and long.headers["retry-after"], (timeout, per_token, long.text[-300:])
    assert long.json()["error"]["code"] == "server_shutting_down" and "--shutdown-timeout" in long.text
    *chunks, error, done = out["stream"]
    assert done == "[DONE]" and chunks
    assert json.loads(error)["error"]["code"] == "server_shutting_down"
    assert "Traceback" not in output
