"""Heavy work stays off the event loop: tokenizing, detokenizing, chat templates and large answers.

* The GIL-free spellings ``offload.encode`` / ``offload.decode`` (a batch of one) give exactly the ids and
  text of ``tokenizers``' single calls (list and string equality), for text that splits characters across
  tokens, special tokens, whitespace runs and the empty string.
* In-process (the demo model behind ``build_app``, its tokenizer wrapped to note the thread of every call):
  a large ``/tokenize``, ``/detokenize``, prompt, chat message and answer do all their tokenizer work on
  a thread other than the event loop's.
* While the pool works, and only then, the GIL changes hands every ``BUSY_SWITCH_S`` (exact, in-process).
* Against the live server: while a 3 MB ``/tokenize`` runs, a concurrent stream's events keep coming, no
  two more than ``STALL_S`` apart (the loop froze for seconds when tokenizing ran on it).
"""

from __future__ import annotations

import asyncio
import threading
import time

import httpx
import pytest
from tokenizers import Tokenizer

from paged import LLM
from paged.demo import DEFAULT_MODEL_PATH
from paged.serve import offload
from paged.serve.app import build_app
from tests.serve.conftest import API_KEY

AUTH = {"Authorization": f"Bearer {API_KEY}"}
CODE = "def add(a, b):\n    return a + b\n\n" * 60  # 1 980 characters, 840 tokens of the demo model
STALL_S = 1.0  # the longest pause a stream may see beside one heavy request (the bound)
TEXTS = ["", "def f(x):\n\treturn x", "€ 中文 ☺ \U0001f600 done", "<|bos|>x<|eos|>", "  \n\n    \t" * 50, CODE * 3]


@pytest.fixture(scope="module")
def tokenizer():
    return Tokenizer.from_file(str(DEFAULT_MODEL_PATH / "tokenizer.json"))


@pytest.mark.parametrize("add_special_tokens", [True, False])
@pytest.mark.parametrize("text", TEXTS, ids=range(len(TEXTS)))
def test_batch_of_one_equals_the_single_calls_exactly(tokenizer, text, add_special_tokens):
    """List equality of ids and string equality of text: the server's spelling changes nothing but the GIL."""
    ids = tokenizer.encode(text, add_special_tokens=add_special_tokens).ids
    assert offload.encode(tokenizer, text, add_special_tokens) == ids
    for skip in (True, False):
        assert offload.decode(tokenizer, ids, skip) == tokenizer.decode(ids, skip_special_tokens=skip)
        assert tokenizer.decode_batch([[t] for t in ids], skip_special_tokens=skip) == \
            [tokenizer.decode([t], skip_special_tokens=skip) for t in ids]  # /tokenize's token strings


def test_token_texts_in_batches_equal_one_call(tokenizer, monkeypatch):
    """List equality: /tokenize's token texts decoded 4 at a time (every batch boundary) are one call's."""
    from paged.serve import tokenize

    ids = tokenizer.encode(TEXTS[-1] + TEXTS[2]).ids  # not a multiple of 4: a short last batch
    monkeypatch.setattr(tokenize, "TEXTS_PER_CALL", 4)
    assert len(ids) % 4 and tokenize.token_texts(tokenizer, ids) == \
        tokenizer.decode_batch([[t] for t in ids], skip_special_tokens=False)


class ThreadNotingTokenizer:
    """A tokenizer that notes the thread of every call that tokenizes or detokenizes."""

    NOTED = ("encode", "decode", "encode_batch", "decode_batch")

    def __init__(self, inner) -> None:
        self.inner = inner
        self.calls: list[tuple[str, threading.Thread]] = []

    def __getattr__(self, name):
        attr = getattr(self.inner, name)
        if name not in self.NOTED:
            return attr

        def call(*args, **kwargs):
            self.calls.append((name, threading.current_thread()))
            return attr(*args, **kwargs)
        return call


# (id, route, body, status, the calls that must run off the loop: all, or only the single decode calls)
LARGE = [
    ("tokenize", "/tokenize", {"prompt": CODE * 40, "return_token_strs": True}, 200, "all"),
    ("detokenize", "/detokenize", {"tokens": [5] * 5000}, 200, "all"),
    ("prompt", "/v1/completions", {"prompt": CODE * 40, "max_tokens": 1}, 400, "all"),
    ("chat", "/v1/chat/completions", {"messages": [{"role": "user", "content": CODE * 40}], "max_tokens": 1}, 400,
     "all"),
    # the answer: 4 x 302 tokens with 6 alternatives each, spelt one decode call per token, off the loop
    ("answer", "/v1/completions", {"prompt": [5] * 300, "n": 4, "echo": True, "logprobs": 5, "max_tokens": 2,
                                   "temperature": 0}, 200, "decode"),
]


def test_the_gil_changes_hands_every_millisecond_only_while_the_pool_works():
    """Exact: inside each of two overlapping pooled jobs (of two pools: the interval is the process's) the
    interval is ``BUSY_SWITCH_S``; it stays so until the last one ends, then it is the interval from before
    (here 0.004 s); small work stays inline."""
    import sys

    before = sys.getswitchinterval()
    sys.setswitchinterval(0.004)
    work, other, seen, release = offload.Offload(), offload.Offload(), [], threading.Event()

    def job(wait: bool) -> float:
        if wait:
            release.wait(10)
        return sys.getswitchinterval()

    async def main():
        first = asyncio.ensure_future(work.pooled(job, True))
        await asyncio.sleep(0.05)
        seen.append(await other.pooled(job, False))  # while the first still runs
        seen.append(sys.getswitchinterval())
        release.set()
        seen.append(await first)
        seen.append(sys.getswitchinterval())
        seen.append(await work.run(1, sys.getswitchinterval))  # inline: not the pool's

    try:
        asyncio.run(main())
    finally:
        work.shutdown()
        other.shutdown()
        got = sys.getswitchinterval()
        sys.setswitchinterval(before)
    busy = offload.BUSY_SWITCH_S
    assert seen == pytest.approx([busy, busy, busy, 0.004, 0.004]) and got == pytest.approx(0.004)


def test_large_tokenizer_work_runs_off_the_event_loop():
    """Every noted call of each large request ran on a thread other than the event loop's (not a timing)."""
    llm = LLM(model=str(DEFAULT_MODEL_PATH), dtype="float32", device="cpu", block_size=8, num_blocks=128, seed=0)
    llm.tokenizer = noted = ThreadNotingTokenizer(llm.tokenizer)
    app = build_app(llm, "m")

    async def go() -> dict:
        loop_thread, seen = threading.current_thread(), {}
        app.fastapi.state.engine.start()
        try:
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1:8000",
                                         timeout=120) as c:
                for name, route, body, status, which in LARGE:
                    noted.calls.clear()
                    r = await c.post(route, json=body)
                    assert r.status_code == status, (name, r.text[:300])
                    calls = [(call, t) for call, t in noted.calls if which == "all" or call == which]
                    seen[name] = (len(calls), sum(t is loop_thread for _, t in calls))
        finally:
            app.fastapi.state.engine.shutdown()
        return seen

    seen = asyncio.run(go())
    for name, (calls, on_loop) in seen.items():
        assert calls > 0 and on_loop == 0, (name, calls, on_loop)


@pytest.mark.parametrize("token_strs", [False, True], ids=["ids", "ids and texts"])
def test_a_3_mb_tokenize_does_not_pause_a_stream(server, token_strs):
    """The longest gap between a stream's events while a 3 MB ``/tokenize`` runs beside it is under ``STALL_S``,
    also when it returns each token's text (1.3 M texts: in one tokenizer call, 1.25 s on an AVX2 EPYC)."""
    times: list[float] = []
    running, done = threading.Event(), threading.Event()

    def stream():  # streams one after another until the tokenize is done (a fast CPU ends one in 2 s)
        body = {"model": "test-model", "prompt": "def f(x):", "max_tokens": 1000, "ignore_eos": True, "stream": True}
        while not done.is_set():
            with httpx.stream("POST", server.url + "/v1/completions", json=body, headers=AUTH, timeout=300) as r:
                for line in r.iter_lines():
                    if done.is_set():
                        break  # hang up: the rest of the stream tells nothing
                    if line.startswith("data: "):
                        times.append(time.monotonic())
                        running.set()

    reader = threading.Thread(target=stream)
    reader.start()
    assert running.wait(60)
    time.sleep(0.2)
    t0 = time.monotonic()
    r = httpx.post(server.url + "/tokenize", json={"prompt": CODE * 1515, "return_token_strs": token_strs},
                   headers=AUTH, timeout=300)
    t1 = time.monotonic()
    done.set()
    reader.join(300)
    assert r.status_code == 200 and r.json()["count"] == len(r.json()["tokens"]) > 10**6
    during = [b - a for a, b in zip(times, times[1:]) if b > t0 and a < t1]  # pauses that overlap the tokenize
    assert times[-1] > min(t1, t0 + 2 * STALL_S), "the stream ended too soon to tell: make it longer"
    assert max(during) < STALL_S, f"the stream paused {max(during):.2f} s beside a {t1 - t0:.2f} s tokenize"
