"""vLLM's ``vllm serve`` options that have no work to do here: accepted with a one-line warning, or refused.

A command line written for vLLM should start this server, or say at once what
it cannot do. Each option below is one of:

* **warned**: accepted; the server logs one line saying what the option means
  here (``--enforce-eager``: there are no CUDA graphs to skip, every step runs
  eagerly). Doing nothing is what the option asks of this engine, or the
  closest honest thing to it.
* **only at a value**: accepted at the value that describes this engine
  (``--pipeline-parallel-size 1``, ``--kv-cache-dtype auto``), refused at
  startup otherwise with a message saying why (argparse's usage error, exit 2).

The options this server honours are in ``cli_options.py``; together the two
are what ``--help`` lists and what docs/serving.md's option table is made from.
"""

from __future__ import annotations

import argparse
import logging
from dataclasses import dataclass

logger = logging.getLogger("paged.serve")


@dataclass(frozen=True)
class Compat:
    """One vLLM option: its spellings, its argparse keywords, what it means here and the values it may take.

    ``allowed``: None (any value: warned when given) or the values accepted (others refused).
    """

    flags: tuple[str, ...]
    meaning: str
    kwargs: dict
    allowed: tuple | None = None

    @property
    def dest(self) -> str:
        return self.flags[0].lstrip("-").replace("-", "_")


def _value(**kw) -> dict:
    return {"default": None, **kw}


SWITCH = {"action": "store_true", "default": None}
COMPAT = [
    Compat(("--gpu-memory-utilization",), "the KV cache's size is --kv-cache-memory (bytes) or "
           "--num-gpu-blocks-override, not a share of the device's memory", _value(type=float, metavar="FRACTION")),
    Compat(("--enforce-eager",), "there are no CUDA graphs here: every step runs eagerly", SWITCH),
    Compat(("--trust-remote-code",), "no code from a checkpoint ever runs here: the model definitions are "
           "paged's own (paged.models)", SWITCH),
    Compat(("--revision", "--code-revision", "--tokenizer-revision"), "checkpoints are local folders or files: "
           "there is no hub to pick a revision from", _value(metavar="REV")),
    Compat(("--download-dir",), "checkpoints are local folders or files: nothing is downloaded", _value()),
    Compat(("--load-format",), "the loader reads safetensors and GGUF, told apart by the file", _value()),
    Compat(("--tokenizer-mode",), "the tokenizer is the checkpoint's tokenizer.json (or GGUF vocabulary)",
           _value()),
    Compat(("--enable-chunked-prefill", "--no-enable-chunked-prefill"), "long prompts are always computed in "
           "chunks of --max-num-batched-tokens (step05's scheduler)", SWITCH),
    Compat(("--disable-log-requests",), "requests are not logged here", SWITCH),
    Compat(("--enable-log-requests",), "requests are not logged here (each refused one gets its error, and "
           "every ignored field a line)", SWITCH),
    Compat(("--disable-log-stats",), "no periodic stats line is logged here: /metrics has them", SWITCH),
    Compat(("--disable-custom-all-reduce",), "tensor parallelism reduces with torch.distributed's own all-reduce",
           SWITCH),
    Compat(("--compilation-config", "-O"), "nothing is compiled with torch.compile here", _value()),
    Compat(("--max-seq-len-to-capture",), "there are no CUDA graphs to capture", _value(type=int)),
    Compat(("--async-scheduling",), "the scheduler plans the next step after the last one returned", SWITCH),
    Compat(("--limit-mm-per-prompt",), "the supported models take text only", _value()),
    Compat(("--enable-request-id-headers",), "responses carry their id in the body (id), not a header", SWITCH),
    Compat(("--enable-prompt-tokens-details",), "usage.prompt_tokens_details.cached_tokens is always reported",
           SWITCH),
    Compat(("--max-num-partial-prefills",), "one prompt is chunked at a time per step's token budget",
           _value(type=int)),
    Compat(("--otlp-traces-endpoint",), "no traces are exported: /metrics has the latencies", _value()),
    Compat(("--chat-template-content-format",), "message content is given to the template as text (content "
           "parts are joined)", _value(choices=["auto", "string", "openai"])),
    Compat(("--pipeline-parallel-size", "-pp"), "the model is split only by --tensor-parallel-size",
           _value(type=int), allowed=(1,)),
    Compat(("--data-parallel-size", "-dp"), "one engine serves: run more servers for data parallelism",
           _value(type=int), allowed=(1,)),
    Compat(("--kv-cache-dtype",), "the KV cache has the model's dtype", _value(), allowed=("auto",)),
    Compat(("--cpu-offload-gb",), "weights stay on the device (the host pool is for swapped KV blocks)",
           _value(type=float), allowed=(0, 0.0)),
    Compat(("--distributed-executor-backend",), "tensor-parallel workers are processes this server starts",
           _value(), allowed=("mp",)),
    Compat(("--response-role",), "a reply's role is assistant", _value(), allowed=("assistant",)),
    Compat(("--speculative-config",), "there is no speculative decoding here", _value(), allowed=()),
    Compat(("--enable-lora",), "LoRA adapters are not supported", SWITCH, allowed=()),
    Compat(("--lora-modules",), "LoRA adapters are not supported", _value(nargs="+"), allowed=()),
    Compat(("--hf-overrides",), "the checkpoint's config is read as it is", _value(), allowed=()),
    Compat(("--enable-sleep-mode",), "the engine cannot release its memory while it runs", SWITCH, allowed=()),
    Compat(("--middleware",), "the server's ASGI stack is fixed (the guard in front of every route)",
           _value(action="append"), allowed=()),
]


def add_to(parser: argparse.ArgumentParser) -> None:
    """Add every option of ``COMPAT`` to ``parser``, in a group of its own."""
    group = parser.add_argument_group("vLLM's options that do not apply here (accepted with a warning, or "
                                      "only at the value this engine has)")
    for compat in COMPAT:
        only = "" if compat.allowed is None else (
            f"; accepted only as {' or '.join(map(str, compat.allowed[:1]))}" if compat.allowed else "; refused")
        group.add_argument(*compat.flags, dest=compat.dest, help=f"{compat.meaning}{only}", **compat.kwargs)


def check(parser: argparse.ArgumentParser, args) -> None:
    """Warn once for each warned option given; refuse (argparse's usage error) one outside its values."""
    for compat in COMPAT:
        value = getattr(args, compat.dest, None)
        if value is None:
            continue
        if compat.allowed is None:
            logger.warning("%s has no effect here: %s", compat.flags[0], compat.meaning)
        elif value not in compat.allowed and not (compat.kwargs.get("action") == "store_true" and not value):
            shown = "" if value is True else " " + (" ".join(map(str, value)) if isinstance(value, list) else
                                                     str(value))
            parser.error(f"{compat.flags[0]}{shown} is not supported here: {compat.meaning}")
