"""Heavy work off the event loop: parsing large bodies, tokenizing, detokenizing, chat templates, grammars,
writing large JSON answers.

One event loop serves every connection, so whatever a handler computes on it
every other client waits for: a 3 MB ``/tokenize`` once froze every stream for
seconds. Work whose size a client chooses therefore runs on a thread pool
(``Offload``), and the handler awaits it.

A thread frees the loop only while the work lets go of the GIL, or is Python
(the interpreter switches threads every few milliseconds). ``tokenizers``'
single calls (``encode``, ``decode``) hold the GIL for their whole run, its
batch calls (``encode_batch``, ``decode_batch``) release it, so the server
tokenizes through ``encode`` and ``decode`` below: a batch of one, the same ids
and text. Jinja templates, building response models and the grammar checks
are Python or short native calls, which the switch interleaves with the loop.

Small work (below ``INLINE_MAX``: a chat turn, a prompt of a few lines) runs
in place: a hand-off costs more than it, and a plain request then never waits
behind a large one queued on the pool.
"""

from __future__ import annotations

import asyncio
import functools
import os
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

INLINE_MAX = 4096  # characters, tokens or logprob entries below which work stays on the loop (~1 ms)
# Large jobs mostly run outside the GIL, so they use a core each; more threads than cores would only
# queue for them, and two let a second large job start while one runs.
DEFAULT_WORKERS = max(2, os.cpu_count() or 1)
BUSY_SWITCH_S = 0.001  # the GIL's hand-over interval while the pool works (Python's default: 0.005)


def encode(tokenizer, text: str, add_special_tokens: bool) -> list[int]:
    """``tokenizer.encode(text).ids``, computed without holding the GIL (a batch of one)."""
    return tokenizer.encode_batch([text], add_special_tokens=add_special_tokens)[0].ids


def decode(tokenizer, ids: list[int], skip_special_tokens: bool) -> str:
    """``tokenizer.decode(ids)``, computed without holding the GIL (a batch of one)."""
    return tokenizer.decode_batch([ids], skip_special_tokens=skip_special_tokens)[0]


class _Busy:
    """The switch interval is ``BUSY_SWITCH_S`` while at least one pooled job runs, in this process (the
    interval is the interpreter's: the count covers every pool, whichever thread's loop awaits it)."""

    def __init__(self) -> None:
        self.lock, self.running, self.saved = threading.Lock(), 0, sys.getswitchinterval()

    def __enter__(self) -> None:
        with self.lock:
            if self.running == 0:
                self.saved = sys.getswitchinterval()
                sys.setswitchinterval(BUSY_SWITCH_S)
            self.running += 1

    def __exit__(self, *exc) -> None:
        with self.lock:
            self.running -= 1
            if self.running == 0:
                sys.setswitchinterval(self.saved)


_BUSY = _Busy()


class Offload:
    """A thread pool for the server's heavy work.

    While a job runs on the pool, the interpreter hands the GIL over every
    ``BUSY_SWITCH_S`` rather than every 5 ms (its default): a job's Python
    (JSON hooks, validators, templates) holds the GIL for whole intervals, and
    each time the event loop or the engine thread wants it back they wait one
    out. Only then: with nothing on the pool the default is restored, since
    more hand-overs cost the engine thread and the loop a few percent of a
    busy server's throughput.

    Args:
        workers: threads in the pool.
    """

    def __init__(self, workers: int = DEFAULT_WORKERS) -> None:
        self.workers = workers
        self._pool: ThreadPoolExecutor | None = None

    async def run(self, size: int, fn, *args):
        """``fn(*args)``: on the pool when ``size`` (the work's characters, tokens or entries) is at least
        ``INLINE_MAX``, else here and now."""
        if size < INLINE_MAX:
            return fn(*args)
        return await self.pooled(fn, *args)

    async def pooled(self, fn, *args):
        """``fn(*args)`` on the pool, whatever its size (the caller decided it is large)."""
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.workers, thread_name_prefix="paged-serve-offload")
        with _BUSY:
            return await asyncio.get_running_loop().run_in_executor(self._pool, functools.partial(fn, *args))

    def shutdown(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
