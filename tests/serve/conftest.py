"""The server under test: ``python -m paged.serve`` as a real subprocess on a free loopback port.

Model: the bundled demo model when ``paged/demo/model`` holds one; before it is
committed, a tiny random Llama with a byte-level BPE tokenizer built here (so
multi-byte characters really split across tokens). Both run in float32.

KV budget: small. With an engine that can preempt (step05 on: it takes
``preemption_mode``) the batch is allowed to outgrow the cache so the load test
forces preemption; with today's step04 engine, which ends the newest request
when the cache is full, ``--max-num-seqs`` keeps the batch inside the cache.
"""

from __future__ import annotations

import inspect
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
STARTUP_TIMEOUT_S = 120


def build_tiny_model(path: Path) -> Path:
    """A random 2-layer Llama whose vocabulary is a byte-level BPE trained on a few texts."""
    import transformers

    from paged.demo.tokenizer import save_tokenizer, train_tokenizer
    from tests.hf_models import save_checkpoint

    texts = ["def add(a, b):\n    return a + b\n", "print('héllo wörld € 漢字 🙂')\n",
             "for i in range(10):\n    x = i * 2\n"] * 20
    tok = train_tokenizer(texts, vocab_size=300)
    vocab = tok.get_vocab_size()
    config = transformers.LlamaConfig(vocab_size=vocab, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                                      bos_token_id=0, eos_token_id=1, tie_word_embeddings=False)
    import torch
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.3)
    save_checkpoint(model, path)
    save_tokenizer(tok, path, model_max_length=256)
    return path


@pytest.fixture(scope="session")
def model_path(tmp_path_factory) -> str:
    if (DEFAULT_MODEL_PATH / "config.json").is_file():
        return str(DEFAULT_MODEL_PATH)
    return str(build_tiny_model(tmp_path_factory.mktemp("tiny_bpe_llama")))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def engine_can_preempt() -> bool:
    from paged import LLM

    return any("preemption_mode" in inspect.signature(c.__init__).parameters
               for c in LLM.engine_class.__mro__ if "__init__" in c.__dict__)


class Server:
    def __init__(self, model: str, extra: list[str], env: dict | None = None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = [sys.executable, "-m", "paged.serve", "--model", model, "--served-model-name", "test-model",
               "--port", str(self.port), "--dtype", "float32", "--device", "cpu", *extra]
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
                self.stop()
                raise RuntimeError(f"server not healthy after {STARTUP_TIMEOUT_S}s:\n{self.output()}")
            time.sleep(0.2)

    def output(self) -> str:
        self.log.flush()
        self.log.seek(0)
        return self.log.read()[-4000:]

    def metrics(self) -> dict[str, float]:
        """``/metrics`` as ``{"name{labels}": value}`` (no API key needed: only /v1 is guarded)."""
        text = httpx.get(self.url + "/metrics", timeout=10).text
        out = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                key, value = line.rsplit(" ", 1)
                out[key] = float(value)
        return out

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.log.close()


def server_args() -> list[str]:
    args = ["--block-size", str(BLOCK_SIZE), "--num-blocks", str(NUM_BLOCKS), "--seed", "0"]
    if engine_can_preempt():
        return args + ["--max-num-seqs", "128"]  # 128 seqs x 3-4 blocks outgrow 200 blocks: preemption
    return args + ["--max-num-seqs", "16"]  # 16 seqs x <= 12 blocks (96 tokens) each fit in 200 blocks


@pytest.fixture(scope="session")
def server(model_path):
    s = Server(model_path, server_args(), env={"PAGED_API_KEY": API_KEY})
    yield s
    s.stop()


@pytest.fixture(scope="session")
def client(server):
    import openai

    return openai.OpenAI(base_url=server.url + "/v1", api_key=API_KEY, max_retries=0, timeout=120)
