"""``python -m paged.serve``: options (vLLM's names), loading the model, starting uvicorn.

Engine options are passed to ``paged.LLM`` only when given, so the server runs
over whichever engine ``paged.LLM`` currently is; an option that engine does
not know yet (``--swap-space`` before step05, ``--tensor-parallel-size``
before step06) stops the server at startup with a message saying so.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import secrets
import sys

from paged.models.default import default_model
from paged.serve.connections import DEFAULT_HEADER_TIMEOUT_S, DEFAULT_IDLE_TIMEOUT_S, DEFAULT_MAX_CONNECTIONS
from paged.serve.guard import DEFAULT_MAX_BODY_BYTES
from paged.serve.shutdown import DEFAULT_SHUTDOWN_TIMEOUT_S

logger = logging.getLogger("paged.serve")

# CLI flag -> LLM keyword, for the engine options passed only when set
ENGINE_OPTIONS = {
    "block_size": "--block-size", "num_blocks": "--num-blocks", "kv_cache_memory": "--kv-cache-memory",
    "swap_space": "--swap-space", "preemption_mode": "--preemption-mode",
    "enable_prefix_caching": "--enable-prefix-caching", "max_num_seqs": "--max-num-seqs",
    "max_num_batched_tokens": "--max-num-batched-tokens", "max_model_len": "--max-model-len",
    "tensor_parallel_size": "--tensor-parallel-size", "attention_backend": "--attention-backend",
    "seed": "--seed", "batch_invariant": "--batch-invariant", "nnodes": "--nnodes", "master_addr": "--master-addr", "master_port": "--master-port",
    "distributed_timeout": "--distributed-timeout", "join_timeout": "--join-timeout",
    "quantization": "--quantization",
}
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


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def check_nodes(p: argparse.ArgumentParser, args) -> None:
    """Refuse an inconsistent placement before anything starts (argparse's usage error, exit code 2)."""
    nnodes, tp = args.nnodes or 1, args.tensor_parallel_size or 1
    if not 0 <= args.node_rank < nnodes:
        p.error(f"--node-rank must be in [0, {nnodes - 1}] for --nnodes {nnodes}, got {args.node_rank}")
    if tp % nnodes:
        p.error(f"--tensor-parallel-size {tp} does not split over --nnodes {nnodes}: it must be a multiple of it")
    if args.headless and args.node_rank == 0:
        p.error("--headless is for the worker hosts (--node-rank >= 1); node 0 runs the driver and the server")
    if args.node_rank > 0 and not args.headless:
        p.error(f"--node-rank {args.node_rank} holds workers only: add --headless (node 0 serves HTTP)")
    if nnodes > 1 and args.master_addr is None:
        p.error("--nnodes > 1 needs --master-addr: the driver host's address, as the other hosts reach it")


def serve_headless(args) -> int:
    """``--headless``: hold this node's ranks until the driver stops them (``hosts.serve_node``)."""
    from datetime import timedelta

    from paged.step06_tensor_parallel.group import DEFAULT_TIMEOUT
    from paged.step06_tensor_parallel.hosts import DEFAULT_MASTER_PORT, Nodes, serve_node
    from paged.step06_tensor_parallel.sharded_model import DEFAULT_INIT_TIMEOUT, DEFAULT_JOIN_TIMEOUT

    nodes = Nodes(args.nnodes, args.master_addr, args.master_port or DEFAULT_MASTER_PORT)
    timeout = timedelta(seconds=args.distributed_timeout) if args.distributed_timeout else DEFAULT_TIMEOUT
    join = timedelta(seconds=args.join_timeout) if args.join_timeout else DEFAULT_JOIN_TIMEOUT
    return serve_node(args.model or default_model()[0], args.dtype, args.device or "cpu", args.tensor_parallel_size,
                      nodes, args.node_rank, timeout, DEFAULT_INIT_TIMEOUT, join)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m paged.serve",
                                description="OpenAI-compatible server over paged's engine.")
    p.add_argument("--model", help="Hugging Face checkpoint folder or GGUF file (default: SmolLM2-135M-Instruct "
                   "when `make install` fetched it, else the bundled demo model)")
    p.add_argument("--served-model-name", help="name clients send as 'model' (default: the default model's "
                   "name, 'SmolLM2-135M-Instruct' or 'paged-demo', else --model as given)")
    p.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16", "float64"])
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available, else cpu)")
    p.add_argument("--quantization", choices=["gguf"], default=None,
                   help="gguf: a GGUF model's linear layers multiply by the file's quantized blocks "
                        "(CPU; default: the weights dequantized once into --dtype)")
    g = p.add_argument_group("engine (passed to paged.LLM only when given)")
    g.add_argument("--block-size", type=positive_int, help="tokens per KV block (engine default 16)")
    kv = g.add_mutually_exclusive_group()
    kv.add_argument("--kv-cache-memory", type=byte_size, help="KV cache budget, e.g. 512MiB")
    kv.add_argument("--num-blocks", type=positive_int, help="KV cache size in blocks")
    g.add_argument("--swap-space", type=byte_size, help="CPU swap pool for preempted requests (step05)")
    g.add_argument("--preemption-mode", choices=["auto", "swap", "recompute"], help="(step05)")
    g.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=None)
    g.add_argument("--max-num-seqs", type=positive_int, help="most sequences in one iteration")
    g.add_argument("--max-num-batched-tokens", type=positive_int, help="most tokens in one iteration")
    g.add_argument("--max-model-len", type=positive_int, help="context length (default: the model's)")
    g.add_argument("--tensor-parallel-size", type=positive_int, help="(step06)")
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
    g.add_argument("--attention-backend", choices=["reference", "blockwise", "cpu", "cuda"])
    g.add_argument("--seed", type=int, help="seeds requests that bring no seed")
    g.add_argument("--batch-invariant", action=argparse.BooleanOptionalAction, default=None,
                   help="attend every token on its own, so an answer does not depend on the batch "
                        "(default: on with the prefix cache; also $VLLM_BATCH_INVARIANT)")
    p.add_argument("--api-key", default=os.environ.get("PAGED_API_KEY") or None,
                   help="require 'Authorization: Bearer <key>' on /v1 (default: $PAGED_API_KEY)")
    p.add_argument("--kv-view-key", default=os.environ.get("PAGED_KV_VIEW_KEY") or None,
                   help="the operator's key for the live KV view's data, /kv/snapshot (default: "
                        "$PAGED_KV_VIEW_KEY, else a random key written in the log); the API key does not open it")
    p.add_argument("--max-request-bytes", type=byte_size, default=DEFAULT_MAX_BODY_BYTES,
                   help=f"largest accepted request body (default {DEFAULT_MAX_BODY_BYTES // 2**20} MiB)")
    p.add_argument("--shutdown-timeout", type=positive_float, default=DEFAULT_SHUTDOWN_TIMEOUT_S,
                   help=f"on SIGTERM: seconds the running requests get to finish before they are ended "
                        f"(default {DEFAULT_SHUTDOWN_TIMEOUT_S:g})")
    c = p.add_argument_group("connections")
    c.add_argument("--max-connections", type=positive_int, default=DEFAULT_MAX_CONNECTIONS,
                   help=f"connections served at once; more get a 503 (default {DEFAULT_MAX_CONNECTIONS}, lowered "
                        "to what the descriptor limit holds)")
    c.add_argument("--idle-timeout", type=positive_float, default=DEFAULT_IDLE_TIMEOUT_S,
                   help=f"seconds a new connection may wait before sending a request (default "
                        f"{DEFAULT_IDLE_TIMEOUT_S:g})")
    c.add_argument("--header-timeout", type=positive_float, default=DEFAULT_HEADER_TIMEOUT_S,
                   help=f"seconds a request's head may take from its first byte (default {DEFAULT_HEADER_TIMEOUT_S:g})")
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    return p


def load_llm(args):
    """``paged.LLM`` with the options the user gave; exits with the engine's message if it refuses one."""
    import torch

    from paged import LLM

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    engine_args = {k: getattr(args, k) for k in ENGINE_OPTIONS if getattr(args, k) is not None}
    try:
        return LLM(model=args.model or default_model()[0], dtype=args.dtype, device=device, **engine_args)
    except ValueError as e:
        sys.exit(f"error: {e}")


def main(argv: list[str] | None = None) -> None:
    p = parser()
    args = p.parse_args(argv)
    check_nodes(p, args)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.headless:
        sys.exit(serve_headless(args))
    import uvicorn

    from paged.models.config import ModelLoadError
    from paged.serve.app import build_app
    from paged.serve.async_engine import describe
    from paged.serve.connections import Shedding, connection_limits
    from paged.serve.shutdown import GracefulServer

    try:
        llm = load_llm(args)
    except ModelLoadError as e:
        sys.exit(f"error: cannot load the model: {e}")
    if args.model is None:
        logger.info("no --model given: serving %s (%s)", *reversed(default_model()))
    name = args.served_model_name or args.model or default_model()[1]
    stats = llm.engine.stats()
    logger.info("model %s (served as %r), %s, max_model_len %d", llm.model.path, name,
                next(llm.model.model.parameters()).dtype, llm.engine.max_model_len)
    logger.info("KV cache: %d blocks of %d tokens = %d tokens", stats["blocks_total"], llm.engine.block_size,
                stats["blocks_total"] * llm.engine.block_size)
    if args.host not in ("127.0.0.1", "localhost", "::1"):
        logger.warning("listening on %s: reachable from other machines%s", args.host,
                       "" if args.api_key else " and no --api-key is set")
    kv_view_key = args.kv_view_key or secrets.token_urlsafe(16)
    logger.info("serving on http://%s:%d/v1 (try GET /v1/models); the live KV cache view, for the operator: "
                "http://%s:%d/kv#key=%s", args.host, args.port, args.host, args.port,
                "<--kv-view-key>" if args.kv_view_key else kv_view_key)
    max_connections, backlog = connection_limits(args.max_connections)
    if max_connections < args.max_connections:
        logger.warning("--max-connections lowered to %d: the descriptor limit (ulimit -n) holds no more",
                       max_connections)

    def stop_serving(err: BaseException) -> None:
        logger.error("the engine failed, so the server stops: %s", describe(err))
        server.should_exit = True  # uvicorn finishes the open responses (each ends with the error), then exits

    app = build_app(llm, name, api_key=args.api_key, max_body_bytes=args.max_request_bytes, bind_host=args.host,
                    on_engine_failure=stop_serving, kv_view_key=kv_view_key)
    shedding = Shedding(max_connections, args.idle_timeout, args.header_timeout)
    config = uvicorn.Config(app, host=args.host, port=args.port, log_level=args.log_level, http=shedding.protocol,
                            backlog=backlog, timeout_graceful_shutdown=5)
    server = GracefulServer(config, app.fastapi.state.engine, args.shutdown_timeout,
                            on_start=lambda loop: loop.set_exception_handler(shedding.exception_handler))
    server.run()
    dead = app.fastapi.state.engine.dead
    if dead is not None:
        sys.exit(f"error: the engine failed: {describe(dead)}")
