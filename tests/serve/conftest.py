"""The server under test: ``python -m paged.serve`` as a real subprocess on a free loopback port.

Model: the bundled demo model (byte-level BPE), in float32.

KV budget: small — the batch may outgrow the cache, so the load test forces
preemption (``tests/serve/test_load.py`` checks that it happened).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from paged.demo import DEFAULT_MODEL_PATH

ROOT = Path(__file__).resolve().parents[2]
BLOCK_SIZE = 8
NUM_BLOCKS = 200
API_KEY = "test-key-1234"
KV_VIEW_KEY = "test-operator-key-5678"  # the live KV view's data: the operator's key, not the clients'
STARTUP_TIMEOUT_S = 300  # generous: the import of torch alone can take a minute on a loaded CPU


@pytest.fixture(scope="session")
def model_path() -> str:
    assert (DEFAULT_MODEL_PATH / "config.json").is_file(), f"the demo model is missing at {DEFAULT_MODEL_PATH}"
    return str(DEFAULT_MODEL_PATH)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, model: str, extra: list[str], env: dict | None = None, host: str = "127.0.0.1") -> None:
        self.port = free_port()
        self.url = f"http://{host}:{self.port}"
        cmd = [sys.executable, "-m", "paged.serve", "--model", model, "--served-model-name", "test-model",
               "--host", host, "--port", str(self.port), "--dtype", "float32", "--device", "cpu", *extra]
        self.log = open(Path(os.environ.get("TMPDIR", "/tmp")) / f"paged_serve_{self.port}.log", "w+")
        self.proc = subprocess.Popen(cmd, cwd=ROOT, stdout=self.log, stderr=subprocess.STDOUT,
                                     env={**os.environ, **(env or {})})
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.output()}")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                output = self.output()
                self.stop()
                raise RuntimeError(f"server not healthy after {STARTUP_TIMEOUT_S}s:\n{output}")
            time.sleep(0.2)

    def output(self, tail: int | None = 4000) -> str:
        """The server's log: its last ``tail`` characters (None: all of it)."""
        self.log.flush()
        self.log.seek(0)
        text = self.log.read()
        return text if tail is None else text[-tail:]

    def metrics(self) -> dict[str, float]:
        """``/metrics`` as ``{"name{labels}": value}`` (no API key needed: only /v1 is guarded)."""
        text = httpx.get(self.url + "/metrics", timeout=10).text
        out = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                key, value = line.rsplit(" ", 1)
                out[key] = float(value)
        return out

    def metric(self, name: str, **labels) -> float:
        """The sum of ``name``'s series whose labels include ``labels`` (0 when none is exported)."""
        return metric(self.metrics(), name, **labels)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.log.close()


def metric(scraped: dict[str, float], name: str, **labels) -> float:
    """The sum of ``name``'s series in ``scraped`` (``Server.metrics``) whose labels include ``labels``."""
    want = [f'{k}="{v}"' for k, v in labels.items()]
    return sum(v for key, v in scraped.items()
               if key.split("{")[0] == name and all(w in key for w in want))


def server_args() -> list[str]:
    args = ["--block-size", str(BLOCK_SIZE), "--num-blocks", str(NUM_BLOCKS), "--seed", "0"]
    return args + ["--max-num-seqs", "128"]  # 128 seqs x 3-4 blocks outgrow 200 blocks: preemption


@pytest.fixture(scope="session")
def server(model_path):
    s = Server(model_path, server_args(), env={"PAGED_API_KEY": API_KEY, "PAGED_KV_VIEW_KEY": KV_VIEW_KEY})
    yield s
    s.stop()


@pytest.fixture(scope="session")
def client(server):
    import openai

    return openai.OpenAI(base_url=server.url + "/v1", api_key=API_KEY, max_retries=0, timeout=120)
