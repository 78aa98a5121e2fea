"""Sampling: how a row of logits becomes the next token (below the ladder: it imports no step).

Not an idea of the paper, which takes sampling for granted; what a serving engine
needs. ``SamplingParams`` (the per-request options, checked at construction),
the batched ``sample`` (temperature, min-p, top-k, top-p, logprobs), the logits
processors (penalties, ``logit_bias``, grammar masks), the per-request
``SamplingState`` and structured output (JSON schema, regex, choice). step03's
engine imports it; every later step uses it unchanged. docs/sampling.md.

Names load on first use (PEP 562), so ``SamplingParams`` does not pull in torch,
which only the sampler and the logits processors need.
"""

from __future__ import annotations

import importlib

_WHERE = {
    "GuidedDecodingParams": "structured",
    "StructuredOutputsParams": "structured",
    "SampleResult": "result",
    "SamplingContext": "logits_processors",
    "SamplingParams": "sampling_params",
    "SamplingState": "sampling_state",
    "process_logits": "logits_processors",
    "sample": "sampler",
}

__all__ = sorted(_WHERE)


def __getattr__(name: str):
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))
