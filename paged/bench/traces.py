"""Length traces: synthetic ShareGPT-like and Alpaca-like ones, or a real JSONL file.

The paper's Figure 2 and its §6 runs use two datasets, of which only the lengths
matter to memory management (§6.1, Figure 11):

=========  ================  ================
dataset    mean prompt len   mean output len
=========  ================  ================
ShareGPT   161.3             338.0
Alpaca     19.3              58.5
=========  ================  ================

We cannot download the datasets, so ``synthetic_trace`` draws lengths from
log-normal distributions with exactly those means (a log-normal is the usual
fit for text lengths: positive, right-skewed, long-tailed). The spread
``sigma`` (of the log) is ours, chosen so that ShareGPT is the wider of the two
as in the paper's Figure 11. Lengths are rounded to integers >= 1, and a pair
whose prompt + output exceeds ``max_len`` is drawn again, so the sample means
sit within a few percent below the targets (the tests bound it).

A real trace is a JSONL file with one ``{"prompt_len": int, "output_len": int}``
object per line; other keys are ignored, blank lines skipped.
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from paged.step01_allocator.waste import TraceRequest


class TraceFormatError(ValueError):
    """A line of a JSONL trace is not a valid request; the message names the line."""


@dataclass(frozen=True)
class LengthModel:
    """Log-normal prompt and output lengths with the paper's means.

    Attributes:
        prompt_mean, output_mean: target means in tokens (the paper's).
        prompt_sigma, output_sigma: standard deviation of the log-length.
    """

    prompt_mean: float
    output_mean: float
    prompt_sigma: float
    output_sigma: float


# --8<-- [start:models]
SYNTHETIC = {
    "sharegpt": LengthModel(prompt_mean=161.3, output_mean=338.0, prompt_sigma=0.9, output_sigma=0.7),
    "alpaca": LengthModel(prompt_mean=19.3, output_mean=58.5, prompt_sigma=0.6, output_sigma=0.8),
}
# --8<-- [end:models]


def _lognormal(rng: np.random.Generator, mean: float, sigma: float) -> int:
    # E[exp(N(mu, sigma^2))] = exp(mu + sigma^2 / 2): pick mu to hit the mean.
    mu = math.log(mean) - sigma**2 / 2
    return max(1, round(float(rng.lognormal(mu, sigma))))


def synthetic_trace(name: str, num_requests: int, seed: int = 0, max_len: int = 2048) -> list[TraceRequest]:
    """Draw a seeded synthetic trace.

    Args:
        name: ``"sharegpt"`` or ``"alpaca"``.
        num_requests: how many requests (>= 1).
        seed: the same seed gives the same trace.
        max_len: longest allowed prompt + output; longer pairs are redrawn.

    Raises:
        ValueError: unknown name, ``num_requests < 1`` or ``max_len < 2``.
    """
    if name not in SYNTHETIC:
        raise ValueError(f"unknown synthetic trace {name!r}; choose one of {sorted(SYNTHETIC)}")
    if num_requests < 1:
        raise ValueError(f"num_requests must be >= 1, got {num_requests}")
    if max_len < 2:
        raise ValueError(f"max_len must be >= 2 (one prompt and one output token), got {max_len}")
    model = SYNTHETIC[name]
    rng = np.random.default_rng(seed)
    trace = []
    while len(trace) < num_requests:
        p = _lognormal(rng, model.prompt_mean, model.prompt_sigma)
        o = _lognormal(rng, model.output_mean, model.output_sigma)
        if p + o <= max_len:
            trace.append(TraceRequest(p, o))
    return trace


def load_jsonl(path: str | Path) -> list[TraceRequest]:
    """Read a trace of ``{"prompt_len": int, "output_len": int}`` lines.

    Raises:
        TraceFormatError: a line that is not a JSON object with both lengths as
            integers >= 1 (the message gives ``path:line``), or no request at all.
    """
    trace = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            where = f"{path}:{number}"
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise TraceFormatError(f"{where}: not valid JSON ({e.msg})") from None
            if not isinstance(row, dict):
                raise TraceFormatError(f"{where}: expected a JSON object, got {type(row).__name__}")
            lengths = []
            for key in ("prompt_len", "output_len"):
                value = row.get(key)
                # bool is an int in Python; a length of `true` is a mistake.
                if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                    raise TraceFormatError(f"{where}: {key} must be an integer >= 1, got {value!r}")
                lengths.append(value)
            trace.append(TraceRequest(*lengths))
    if not trace:
        raise TraceFormatError(f"{path}: no requests in the file")
    return trace


def clip_to_max_len(trace: list[TraceRequest], max_len: int) -> tuple[list[TraceRequest], int, int]:
    """Fit a real trace to a model's context: what a server would do.

    A prompt of ``max_len`` tokens or more leaves no room to generate and is
    dropped; an output that would run past ``max_len`` stops there.

    Returns:
        ``(kept, num_dropped, num_clipped)``.
    """
    kept, dropped, clipped = [], 0, 0
    for r in trace:
        if r.prompt_len >= max_len:
            dropped += 1
        elif r.total_len > max_len:
            kept.append(TraceRequest(r.prompt_len, max_len - r.prompt_len))
            clipped += 1
        else:
            kept.append(r)
    return kept, dropped, clipped


def random_prompts(lengths: list[int], vocab_size: int, seed: int) -> list[list[int]]:
    """Random prompts of the given lengths: token ids 3.. (clear of BOS 1 and EOS 2), seeded."""
    rng = random.Random(seed)
    return [[rng.randrange(3, vocab_size) for _ in range(n)] for n in lengths]
