"""The options of ``python -m paged.serve``: vLLM's names and units, and the table docs/serving.md shows.

A ``vllm serve`` command line should work here as it is: the model may be the
first argument or ``--model``; sizes take vLLM's units (``--swap-space 4`` is
4 GiB, ``--max-model-len 4k`` is 4 000 tokens and ``4K`` 4 096); ``--dtype
half`` and ``float`` are float16 and float32; ``-tp`` and ``-q`` are the short
forms. Engine options are passed to ``paged.LLM`` only when given, so the server
runs over whichever engine ``paged.LLM`` is; the two the server sets itself are
``--long-prefill-seconds`` (``SERVE_LONG_PREFILL_SECONDS``: a long prompt's chunks
cut to a time, which the engine alone leaves off) and ``--scheduling-policy``
(``SERVE_SCHEDULING_POLICY``: fair shares across the addresses requests come
from; the engine alone, with one client, is first-come-first-served). vLLM's options that have nothing
to do here are in ``vllm_flags.py`` (accepted with a warning, or only at the
value this engine has).

``options_table`` writes the parser as the Markdown table in docs/serving.md,
so ``--help`` and the page list the same options
(``tests/serve/test_cli.py`` compares them).
"""

from __future__ import annotations

import argparse
import os
import re

from paged.serve import vllm_flags
from paged.serve.connections import (DEFAULT_BODY_TIMEOUT_S, DEFAULT_HEADER_TIMEOUT_S, DEFAULT_IDLE_TIMEOUT_S,
                                     DEFAULT_MAX_CONNECTIONS, PER_CLIENT_SHARE)
from paged.serve.guard import DEFAULT_MAX_BODY_BYTES
from paged.serve.options import DEFAULT_MAX_LOGPROBS, DEFAULT_RESPONSE_STORE
from paged.serve.reasoning import PARSERS as REASONING_PARSERS
from paged.serve.shutdown import DEFAULT_SHUTDOWN_TIMEOUT_S
from paged.serve.tool_parsers import PARSERS as TOOL_PARSERS

# CLI flag -> LLM keyword, for the engine options passed only when set
ENGINE_OPTIONS = {
    "block_size": "--block-size", "num_blocks": "--num-blocks", "kv_cache_memory": "--kv-cache-memory",
    "swap_space": "--swap-space", "preemption_mode": "--preemption-mode",
    "enable_prefix_caching": "--enable-prefix-caching", "max_num_seqs": "--max-num-seqs",
    "max_num_batched_tokens": "--max-num-batched-tokens", "max_model_len": "--max-model-len",
    "tensor_parallel_size": "--tensor-parallel-size", "attention_backend": "--attention-backend",
    "seed": "--seed", "batch_invariant": "--batch-invariant", "nnodes": "--nnodes", "master_addr": "--master-addr",
    "master_port": "--master-port", "distributed_timeout": "--distributed-timeout", "join_timeout": "--join-timeout",
    "quantization": "--quantization", "long_prefill_token_threshold": "--long-prefill-token-threshold",
    "long_prefill_seconds": "--long-prefill-seconds", "scheduling_policy": "--scheduling-policy",
}
# The server cuts a long prompt's chunks to a time as well (the engine alone does not: its schedule stays the
# same on any machine): a request arriving beside a long prompt waits about two iterations.
SERVE_LONG_PREFILL_SECONDS = 0.4
# The server shares the device fairly between the addresses its requests come from (FairShare): one client's
# hundreds of requests cannot keep another's waiting. With one client it schedules exactly as FCFS.
SERVE_SCHEDULING_POLICY = "fair"
SCHEDULING_POLICIES = ("fair", "fcfs", "priority")
DTYPES = {"auto": "auto", "half": "float16", "float16": "float16", "bfloat16": "bfloat16", "float": "float32",
          "float32": "float32", "float64": "float64"}
_UNITS = {"": 1, "b": 1, "k": 2**10, "kb": 10**3, "kib": 2**10, "m": 2**20, "mb": 10**6, "mib": 2**20,
          "g": 2**30, "gb": 10**9, "gib": 2**30}


def byte_size(text: str) -> int:
    """``"512MiB"``, ``"1.5GiB"``, ``"1e9"`` or ``"4096"`` -> bytes."""
    m = re.fullmatch(r"\s*([0-9.]+(?:e[0-9]+)?)\s*([a-zA-Z]*)\s*", text)
    if not m or m.group(2).lower() not in _UNITS:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size: use bytes or a unit (KiB, MiB, GiB, MB, GB)")
    value = int(float(m.group(1)) * _UNITS[m.group(2).lower()])
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: a size must be positive")
    return value


def scheduling_policy(text: str) -> str:
    """``fair``, ``fcfs`` or ``priority``; another name is refused, naming these."""
    if text not in SCHEDULING_POLICIES:
        raise argparse.ArgumentTypeError(f"{text!r} is not a scheduling policy: the policies are "
                                         f"{', '.join(SCHEDULING_POLICIES)}")
    return text


def gib_size(text: str) -> int:
    """vLLM's ``--swap-space``: a bare number is GiB (``4``, ``0.5``); with a unit, that unit (``512MiB``)."""
    if re.fullmatch(r"\s*[0-9.]+(?:e[0-9]+)?\s*", text):
        return byte_size(text.strip() + "GiB")
    return byte_size(text)


def token_count(text: str) -> int | None:
    """vLLM's readable integers: ``4096``, ``4k`` (4 000), ``4K`` (4 096), ``1m`` / ``1M``, ``0.5K``;
    ``auto`` or ``-1``: None (the model's own)."""
    if text.strip().lower() in ("auto", "-1"):
        return None
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([kKmMgG]?)\s*", text)
    if not m:
        raise argparse.ArgumentTypeError(f"{text!r} is not a token count: use 4096, 4k (4000), 4K (4096), 1M or auto")
    scale = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "K": 2**10, "M": 2**20, "G": 2**30}[m.group(2)]
    value = float(m.group(1)) * scale
    if value != int(value) or value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of tokens >= 1")
    return int(value)


def int_at_least(low: int):
    """An argparse type: an integer ``>= low``, refused with the bound otherwise."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be >= {low}, got {value}")
        return value
    return parse


positive_int = int_at_least(1)
non_negative_int = int_at_least(0)


def float_above(low: float, *, or_equal: bool = False):
    """An argparse type: a number ``> low`` (``>= low`` with ``or_equal``), refused with the bound
    otherwise (NaN included)."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not (value >= low if or_equal else value > low):
            raise argparse.ArgumentTypeError(f"must be {'>=' if or_equal else '>'} {low:g}, got {text}")
        return value
    return parse


positive_float = float_above(0)
non_negative_float = float_above(0, or_equal=True)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m paged.serve",
                                description="OpenAI-compatible server over paged's engine (vLLM's options).")
    p.add_argument("model_tag", nargs="?", metavar="MODEL", help="the model, as vllm serve takes it: the same as "
                   "--model")
    p.add_argument("--model", help="Hugging Face checkpoint folder or GGUF file (default: SmolLM2-135M-Instruct "
                   "when `make install` fetched it, else the bundled demo model)")
    p.add_argument("--served-model-name", nargs="+", metavar="NAME", help="the name(s) clients send as 'model'; "
                   "the first is the one answers carry (default: 'SmolLM2-135M-Instruct' or 'paged-demo' for the "
                   "default models, else --model as given)")
    p.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=8000, help="(default 8000)")
    p.add_argument("--dtype", default="auto", choices=list(DTYPES), help="auto (the checkpoint's), half / float16, "
                   "bfloat16, float / float32, float64")
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available, else cpu)")
    p.add_argument("--quantization", "-q", choices=["gguf"], default=None,
                   help="gguf: a GGUF model's linear layers multiply by the file's quantized blocks "
                        "(CPU; default: the weights dequantized once into --dtype)")
    p.add_argument("--chat-template", help="a chat template (a file, or the template itself) in place of the "
                   "checkpoint's")
    p.add_argument("--generation-config", default="auto", help="auto (default): the model folder's "
                   "generation_config.json gives requests their default temperature, top_p, top_k, min_p and "
                   "repetition_penalty; vllm: none; or a folder holding a generation_config.json")
    p.add_argument("--override-generation-config", type=_json_object, metavar="JSON", help="defaults to set over "
                   "the generation config's, e.g. '{\"temperature\": 0.5}'")
    g = p.add_argument_group("engine (passed to paged.LLM only when given)")
    g.add_argument("--block-size", type=positive_int, help="tokens per KV block (engine default 16)")
    kv = g.add_mutually_exclusive_group()
    kv.add_argument("--kv-cache-memory", "--kv-cache-memory-bytes", type=byte_size, metavar="SIZE",
                    help="KV cache budget, e.g. 512MiB, 2GiB, or bytes; the number of blocks is derived "
                         "(engine default 512 MiB)")
    kv.add_argument("--num-blocks", "--num-gpu-blocks-override", type=positive_int, metavar="N",
                    help="KV cache size in blocks (instead of --kv-cache-memory)")
    g.add_argument("--swap-space", type=gib_size, metavar="GiB", help="host memory for swapped-out blocks, in GiB "
                   "as vLLM's (4 = 4 GiB), or with a unit (512MiB) (step05; engine default 256 MiB)")
    g.add_argument("--preemption-mode", choices=["auto", "swap", "recompute"], help="how a request is preempted "
                   "(step05; engine default auto)")
    g.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=None,
                   help="reuse cached full prompt blocks (engine default on)")
    g.add_argument("--max-num-seqs", type=positive_int, help="most sequences in one iteration (engine default 256)")
    g.add_argument("--max-num-batched-tokens", type=positive_int, help="most tokens in one iteration")
    g.add_argument("--long-prefill-token-threshold", type=non_negative_int, metavar="N",
                   help="most prompt tokens one sequence computes in an iteration, so a request arriving "
                        "during a long prompt starts within one iteration (engine default 256; 0: no cap; step05)")
    g.add_argument("--long-prefill-seconds", type=non_negative_float, default=SERVE_LONG_PREFILL_SECONDS,
                   metavar="S", help="cut a long prompt's chunk further, so that an iteration's prompt chunks "
                   "compute in S seconds by what this machine's iterations have cost (default "
                   f"{SERVE_LONG_PREFILL_SECONDS}; 0: tokens only, the engine's default; step05)")
    g.add_argument("--scheduling-policy", type=scheduling_policy, default=SERVE_SCHEDULING_POLICY,
                   metavar="{fair,fcfs,priority}", help="who goes first: fair (default): the address with the "
                   "fewest requests running (an IPv6 address: its /64), first-come-first-served within one address, "
                   "and its newest request is the first preempted; fcfs: the paper's first-come-first-served over "
                   "every request (the engine's default); priority: vLLM's, the smallest request field priority "
                   "first, first-come-first-served within a priority (step05)")
    g.add_argument("--max-model-len", type=token_count, metavar="N", help="context length: 4096, 4k, 4K or auto "
                   "(default: the model's)")
    g.add_argument("--tensor-parallel-size", "-tp", type=positive_int, metavar="N", help="tensor parallelism "
                   "(step06)")
    g.add_argument("--attention-backend", choices=["reference", "blockwise", "cpu", "cuda"],
                   help="(default: the fastest available)")
    g.add_argument("--seed", type=int, help="seeds requests that bring no seed (engine default 0)")
    g.add_argument("--batch-invariant", action=argparse.BooleanOptionalAction, default=None,
                   help="attend every token on its own, so an answer does not depend on the batch "
                        "(default: on with the prefix cache; also $VLLM_BATCH_INVARIANT)")
    _hosts(p)
    a = p.add_argument_group("the API")
    a.add_argument("--api-key", default=os.environ.get("PAGED_API_KEY") or None,
                   help="require 'Authorization: Bearer <key>' on /v1 (default: $PAGED_API_KEY)")
    a.add_argument("--enable-auto-tool-choice", action="store_true", help="serve tool_choice \"auto\": the model "
                   "decides whether to call a tool (needs --tool-call-parser)")
    a.add_argument("--tool-call-parser", choices=sorted(TOOL_PARSERS), help="the format the model writes its tool "
                   "calls in")
    a.add_argument("--reasoning-parser", choices=sorted(REASONING_PARSERS), help="split the model's <think> "
                   "reasoning into reasoning_content")
    a.add_argument("--max-logprobs", type=int, default=DEFAULT_MAX_LOGPROBS, help=f"the most logprobs a request "
                   f"may ask for (default {DEFAULT_MAX_LOGPROBS})")
    a.add_argument("--response-store", type=int, default=DEFAULT_RESPONSE_STORE, metavar="N",
                   help=f"responses /v1/responses keeps for previous_response_id (default {DEFAULT_RESPONSE_STORE}); as many "
                        "may run in the background, a quarter of them one client's")
    a.add_argument("--disable-fastapi-docs", action="store_true", help="serve no /docs page and no /openapi.json")
    a.add_argument("--root-path", default="", help="the path prefix a proxy serves this server under")
    a.add_argument("--allowed-origins", type=_json_list, metavar="JSON", help="CORS: origins that may read "
                   "answers from a browser, e.g. '[\"http://localhost:3000\"]' (default: none)")
    a.add_argument("--allowed-methods", type=_json_list, default=["*"], metavar="JSON", help="CORS methods "
                   "(default [\"*\"], with --allowed-origins)")
    a.add_argument("--allowed-headers", type=_json_list, default=["*"], metavar="JSON", help="CORS headers "
                   "(default [\"*\"], with --allowed-origins)")
    a.add_argument("--allow-credentials", action="store_true", help="CORS: allow credentials")
    _server(p)
    vllm_flags.add_to(p)
    return p


def _hosts(p: argparse.ArgumentParser) -> None:
    h = p.add_argument_group("across hosts (step06): the same command on every host, each with its --node-rank")
    h.add_argument("--nnodes", type=positive_int, help="hosts sharing the --tensor-parallel-size ranks (default 1)")
    h.add_argument("--node-rank", type=int, default=0, help="this host's place: 0 = the driver (scheduler, block "
                   "manager, HTTP server), 1..nnodes-1 = --headless workers")
    h.add_argument("--master-addr", help="the driver host's address, as the other hosts reach it (default 127.0.0.1)")
    h.add_argument("--master-port", type=positive_int, help="the port the driver listens on for the other hosts' "
                   "ranks (default 29501)")
    h.add_argument("--headless", action="store_true", help="hold this node's ranks and obey the driver: no "
                   "scheduler, no HTTP server (--node-rank >= 1)")
    h.add_argument("--distributed-timeout", type=positive_float, help="seconds any one collective may wait "
                   "(default 300): how soon a cut link is noticed")
    h.add_argument("--join-timeout", type=positive_float, help="seconds the driver waits for the other hosts' "
                   "ranks, and a headless host for the driver (default 600)")


def _server(p: argparse.ArgumentParser) -> None:
    s = p.add_argument_group("the server")
    s.add_argument("--kv-view-key", default=os.environ.get("PAGED_KV_VIEW_KEY") or None,
                   help="the operator's key for the live KV view's data, /kv/snapshot (default: "
                        "$PAGED_KV_VIEW_KEY, else a random key written in the log); the API key does not open it")
    s.add_argument("--max-request-bytes", type=byte_size, default=DEFAULT_MAX_BODY_BYTES, metavar="SIZE",
                   help=f"largest accepted request body (default {DEFAULT_MAX_BODY_BYTES // 2**20} MiB)")
    s.add_argument("--shutdown-timeout", type=positive_float, default=DEFAULT_SHUTDOWN_TIMEOUT_S, metavar="S",
                   help=f"on SIGTERM: seconds the running requests get to finish before they are ended "
                        f"(default {DEFAULT_SHUTDOWN_TIMEOUT_S:g})")
    s.add_argument("--max-connections", type=positive_int, default=DEFAULT_MAX_CONNECTIONS, metavar="N",
                   help=f"connections served at once; more get a 503 (default {DEFAULT_MAX_CONNECTIONS}, lowered "
                        "to what the descriptor limit holds)")
    s.add_argument("--max-connections-per-client", type=non_negative_int, metavar="N",
                   help=f"connections one other machine's address (an IPv6 one: its /64) may hold at once; more get "
                        f"a 503 (default: a quarter of --max-connections, {DEFAULT_MAX_CONNECTIONS // PER_CLIENT_SHARE}; "
                        "this machine's own connections are not counted; 0: no per-client cap, e.g. behind a proxy "
                        "on another host, where every client has the proxy's address)")
    s.add_argument("--idle-timeout", type=positive_float, default=DEFAULT_IDLE_TIMEOUT_S, metavar="S",
                   help=f"seconds a new connection may wait before sending a request (default "
                        f"{DEFAULT_IDLE_TIMEOUT_S:g})")
    s.add_argument("--header-timeout", type=positive_float, default=DEFAULT_HEADER_TIMEOUT_S, metavar="S",
                   help=f"seconds a request's head may take from its first byte (default {DEFAULT_HEADER_TIMEOUT_S:g})")
    s.add_argument("--body-timeout", type=positive_float, default=DEFAULT_BODY_TIMEOUT_S, metavar="S",
                   help=f"seconds a request's body may take after its head (default {DEFAULT_BODY_TIMEOUT_S:g})")
    s.add_argument("--ssl-keyfile", help="serve HTTPS with this key (and --ssl-certfile)")
    s.add_argument("--ssl-certfile", help="serve HTTPS with this certificate")
    s.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"],
                   help="the server's log (default info)")
    s.add_argument("--uvicorn-log-level", choices=["debug", "info", "warning", "error", "critical", "trace"],
                   help="uvicorn's own log (default: --log-level)")


def _json_list(text: str) -> list:
    import json

    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        raise argparse.ArgumentTypeError(f"{text!r} is not JSON: give a list such as '[\"*\"]'") from None
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise argparse.ArgumentTypeError(f"{text!r} is not a JSON list of strings")
    return value


def _json_object(text: str) -> dict:
    import json

    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        value = None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"{text!r} is not a JSON object such as '{{\"temperature\": 0.5}}'")
    return value


def options_table(p: argparse.ArgumentParser | None = None) -> str:
    """Every option of the parser as a Markdown table (option, what it does), in ``--help``'s order."""
    p = p or parser()
    rows = ["| option | meaning |", "|---|---|"]
    for action in p._actions:
        if action.help == argparse.SUPPRESS or isinstance(action, argparse._HelpAction):
            continue
        if action.option_strings:
            spelt = ", ".join(f"`{s}`" for s in action.option_strings)
        else:
            spelt = f"`{action.metavar or action.dest}` (positional)"
        meaning = (action.help or "").replace("|", "\\|")
        if action.choices and "{" not in meaning:
            meaning += f" [{', '.join(map(str, action.choices))}]"
        rows.append(f"| {spelt} | {meaning} |")
    return "\n".join(rows) + "\n"


if __name__ == "__main__":  # python -m paged.serve.cli_options: the table for docs/serving.md
    print(options_table(), end="")
