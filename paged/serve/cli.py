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
import sys

from paged.models.default import default_model
from paged.serve.app import DEFAULT_MAX_BODY_BYTES

logger = logging.getLogger("paged.serve")

# CLI flag -> LLM keyword, for the engine options passed only when set
ENGINE_OPTIONS = {
    "block_size": "--block-size", "num_blocks": "--num-blocks", "kv_cache_memory": "--kv-cache-memory",
    "swap_space": "--swap-space", "preemption_mode": "--preemption-mode",
    "enable_prefix_caching": "--enable-prefix-caching", "max_num_seqs": "--max-num-seqs",
    "max_num_batched_tokens": "--max-num-batched-tokens", "max_model_len": "--max-model-len",
    "tensor_parallel_size": "--tensor-parallel-size", "attention_backend": "--attention-backend",
    "seed": "--seed", "batch_invariant": "--batch-invariant",
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
    g.add_argument("--attention-backend", choices=["reference", "blockwise", "cpu", "cuda"])
    g.add_argument("--seed", type=int, help="seeds requests that bring no seed")
    g.add_argument("--batch-invariant", action=argparse.BooleanOptionalAction, default=None,
                   help="attend every token on its own, so an answer does not depend on the batch "
                        "(default: on with the prefix cache; also $VLLM_BATCH_INVARIANT)")
    p.add_argument("--api-key", default=os.environ.get("PAGED_API_KEY") or None,
                   help="require 'Authorization: Bearer <key>' on /v1 (default: $PAGED_API_KEY)")
    p.add_argument("--max-request-bytes", type=byte_size, default=DEFAULT_MAX_BODY_BYTES,
                   help=f"largest accepted request body (default {DEFAULT_MAX_BODY_BYTES // 2**20} MiB)")
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
    args = parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    import uvicorn

    from paged.models.config import ModelLoadError
    from paged.serve.app import build_app
    from paged.serve.async_engine import describe

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
    logger.info("serving on http://%s:%d/v1 (try GET /v1/models)", args.host, args.port)
    def stop_serving(err: BaseException) -> None:
        logger.error("the engine failed, so the server stops: %s", describe(err))
        server.should_exit = True  # uvicorn finishes the open responses (each ends with the error), then exits

    app = build_app(llm, name, api_key=args.api_key, max_body_bytes=args.max_request_bytes,
                    on_engine_failure=stop_serving)
    server = uvicorn.Server(uvicorn.Config(app, host=args.host, port=args.port, log_level=args.log_level,
                                           timeout_graceful_shutdown=5))
    server.run()
    dead = app.fastapi.state.engine.dead
    if dead is not None:
        sys.exit(f"error: the engine failed: {describe(dead)}")
