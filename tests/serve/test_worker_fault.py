"""A tensor-parallel worker killed under load: the server (TP=2) serves 50 streams, rank 1 gets SIGKILL.

What must hold: every in-flight stream ends with an error event that names
the rank and the signal (no stream hangs or just breaks off); the server then
exits with a non-zero status and a message naming the rank; no process of the
server is left behind.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal

import httpx
import psutil
import pytest

from tests.serve.conftest import API_KEY, Server

NUM_STREAMS = 50
EXIT_TIMEOUT_S = 60
ORPHAN_TIMEOUT_S = 10
pytestmark = pytest.mark.slow


async def stream_until_error(http: httpx.AsyncClient, i: int, started: asyncio.Queue) -> str:
    """Stream one long completion; return the error message it ended with ("" if it ended without one)."""
    body = {"prompt": f"def f{i}(x):", "max_tokens": 400, "ignore_eos": True, "stream": True, "seed": i}
    first = True
    async with http.stream("POST", "/v1/completions", json=body) as r:
        assert r.status_code == 200, await r.aread()
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if "error" in chunk:
                return chunk["error"]["message"]
            if first:
                first = False
                started.put_nowait(i)
    return ""


def test_sigkill_of_a_worker_under_50_streams_errors_each_and_the_server_exits_naming_the_rank(model_path):
    """Exact outcomes: 50 of 50 streams end with an error naming 'rank 1' and SIGKILL, the server exits
    with a non-zero code whose output names rank 1, and 0 of its child processes are left running 10 s later."""
    server = Server(model_path, ["--tensor-parallel-size", "2", "--block-size", "8", "--num-blocks", "400",
                                 "--max-num-seqs", "64", "--seed", "0"], env={"PAGED_API_KEY": API_KEY})
    try:
        children = psutil.Process(server.proc.pid).children(recursive=True)
        workers = [c for c in children if "spawn_main" in " ".join(c.cmdline())]
        assert len(workers) == 1, [c.cmdline() for c in children]

        async def run():
            started: asyncio.Queue = asyncio.Queue()
            limits = httpx.Limits(max_connections=NUM_STREAMS)
            async with httpx.AsyncClient(base_url=server.url, headers={"Authorization": f"Bearer {API_KEY}"},
                                         limits=limits, timeout=120) as http:
                tasks = [asyncio.ensure_future(stream_until_error(http, i, started)) for i in range(NUM_STREAMS)]
                for _ in range(NUM_STREAMS):  # every stream is running: its first tokens arrived
                    await asyncio.wait_for(started.get(), 120)
                os.kill(workers[0].pid, signal.SIGKILL)
                return await asyncio.gather(*tasks)

        errors = asyncio.run(run())
        assert len(errors) == NUM_STREAMS
        for message in errors:
            assert "rank 1" in message and "SIGKILL" in message, message
        code = server.proc.wait(EXIT_TIMEOUT_S)
        output = server.output()
        assert code != 0, output
        assert "error: the engine failed" in output and "rank 1" in output, output
        # the worker and multiprocessing's resource tracker (it exits once its parent's pipe closes)
        _, alive = psutil.wait_procs(children, timeout=ORPHAN_TIMEOUT_S)
        assert not alive, [(p.pid, p.cmdline()) for p in alive]
    finally:
        server.stop()
