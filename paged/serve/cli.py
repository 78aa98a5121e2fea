"""``python -m paged.serve``: the port claimed, the model loaded, the options applied, uvicorn started.

The options, with vLLM's names and units, are in ``cli_options.py`` (and the
vLLM options that do nothing here in ``vllm_flags.py``). In order, ``main``:

1. parses them; an inconsistent placement or an option at a value this engine
   cannot have is argparse's usage error (exit 2); a vLLM option that has no
   effect here gets one warning line;
2. claims the port (``--host``, ``--port``) before anything slow, so a busy
   port is said at once, not after the model loaded and the "serving on" line;
3. loads the model (``paged.LLM`` with the engine options that were given: an
   option the engine refuses exits with the engine's message);
4. builds the app (``build_app``) and serves it on the claimed socket.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import socket
import sys
from pathlib import Path

from paged import _openmp
from paged.models.default import CHAT_MODEL_NAME, DEFAULT_MODEL_PATH, chat_model_path, default_model
from paged.serve import vllm_flags
from paged.serve.cli_options import DTYPES, ENGINE_OPTIONS, parser  # noqa: F401 (parser: the options, for tests)

logger = logging.getLogger("paged.serve")
SAMPLING_DEFAULTS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")


def check_nodes(p, args) -> None:
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


def resolve_model(p, args) -> None:
    """``MODEL`` (vllm serve's first argument) and ``--model`` are one option; given both, they must agree."""
    if args.model_tag is not None:
        if args.model is not None and args.model != args.model_tag:
            p.error(f"the model is given twice, as {args.model_tag!r} and as --model {args.model!r}")
        args.model = args.model_tag


def served_names(args) -> list[str]:
    """The names clients may send: ``--served-model-name``, else the default models' own names (the demo
    model is ``paged-demo`` however its folder was named), else ``--model`` as given."""
    if args.served_model_name:
        return args.served_model_name
    if args.model is None:
        return [default_model()[1]]
    given = Path(args.model).resolve()
    known = {DEFAULT_MODEL_PATH.resolve(): "paged-demo", chat_model_path().resolve(): CHAT_MODEL_NAME}
    return [known.get(given, args.model)]


def claim_port(host: str, port: int) -> socket.socket:
    """The listening socket, bound now; a busy port exits with a message naming it (before the model loads)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        sys.exit(f"error: cannot listen on {host}:{port}: {e.strerror or e} (another server there? choose "
                 "another --port)")
    return sock


def serve_headless(args) -> int:
    """``--headless``: hold this node's ranks until the driver stops them (``hosts.serve_node``)."""
    from datetime import timedelta

    from paged.step06_tensor_parallel.group import DEFAULT_TIMEOUT
    from paged.step06_tensor_parallel.hosts import DEFAULT_MASTER_PORT, Nodes, serve_node
    from paged.step06_tensor_parallel.sharded_model import DEFAULT_INIT_TIMEOUT, DEFAULT_JOIN_TIMEOUT

    nodes = Nodes(args.nnodes, args.master_addr, args.master_port or DEFAULT_MASTER_PORT)
    timeout = timedelta(seconds=args.distributed_timeout) if args.distributed_timeout else DEFAULT_TIMEOUT
    join = timedelta(seconds=args.join_timeout) if args.join_timeout else DEFAULT_JOIN_TIMEOUT
    return serve_node(args.model or default_model()[0], DTYPES[args.dtype], args.device or "cpu",
                      args.tensor_parallel_size, nodes, args.node_rank, timeout, DEFAULT_INIT_TIMEOUT, join)


def load_llm(args):
    """``paged.LLM`` with the options the user gave; exits with the engine's message if it refuses one."""
    import torch

    from paged import LLM

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    engine_args = {k: getattr(args, k) for k in ENGINE_OPTIONS if getattr(args, k) is not None}
    try:
        return LLM(model=args.model or default_model()[0], dtype=DTYPES[args.dtype], device=device, **engine_args)
    except ValueError as e:
        sys.exit(f"error: {e}")


def chat_template(text: str | None) -> str | None:
    """``--chat-template``: a file's text, or the argument itself when it names no file (vLLM's rule)."""
    if text is None:
        return None
    path = Path(text)
    try:
        return path.read_text(encoding="utf-8") if path.is_file() else text
    except OSError as e:
        sys.exit(f"error: --chat-template {text}: {e}")


def sampling_defaults(args, model_path: str) -> dict:
    """Request defaults from ``generation_config.json`` (``--generation-config auto`` or a folder), then
    ``--override-generation-config``; ``vllm``: none."""
    defaults: dict = {}
    where = {"auto": Path(model_path), "vllm": None}.get(args.generation_config, Path(args.generation_config))
    if where is not None:
        file = (where if where.is_dir() else where.parent) / "generation_config.json"
        if args.generation_config not in ("auto", "vllm") and not file.is_file():
            sys.exit(f"error: --generation-config {args.generation_config}: no generation_config.json there")
        if file.is_file():
            config = json.loads(file.read_text(encoding="utf-8"))
            defaults = {k: config[k] for k in SAMPLING_DEFAULTS if k in config}
    defaults.update({k: v for k, v in (args.override_generation_config or {}).items() if k in SAMPLING_DEFAULTS})
    return defaults


def main(argv: list[str] | None = None) -> None:
    p = parser()
    args = p.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    resolve_model(p, args)
    check_nodes(p, args)
    vllm_flags.check(p, args)
    if args.headless:
        sys.exit(serve_headless(args))
    sock = claim_port(args.host, args.port)
    run(args, sock)


def spinning_note(environ) -> str | None:
    """A warning for a server whose idle OpenMP threads spin (the user set ``OMP_WAIT_POLICY=active`` or a
    long ``GOMP_SPINCOUNT``): they hold the cores the server's own threads need. Measured on 2 cores, a
    lone stream's tokens came about 1.4x slower than with them asleep (docs/benchmarks.md)."""
    if not _openmp.threads_spin(environ):
        return None
    return ("idle OpenMP threads spin here (OMP_WAIT_POLICY / GOMP_SPINCOUNT is set so): they hold cores the "
            "server's own threads need, and on 2 cores a lone stream decoded about 1.4x slower than with them "
            "asleep, paged's default (unset both; docs/benchmarks.md)")


def run(args, sock: socket.socket) -> None:
    """Load the model and serve on ``sock`` until stopped."""
    import uvicorn

    from paged.models.config import ModelLoadError
    from paged.serve.app import build_app
    from paged.serve.async_engine import describe
    from paged.serve.connections import Shedding, connection_limits
    from paged.serve.options import ServeOptions
    from paged.serve.shutdown import GracefulServer

    try:
        llm = load_llm(args)
    except ModelLoadError as e:
        sys.exit(f"error: cannot load the model: {e}")
    if args.model is None:
        logger.info("no --model given: serving %s (%s)", *reversed(default_model()))
    if args.chat_template is not None:
        llm.model.chat_template = chat_template(args.chat_template)
    names = served_names(args)
    try:
        options = ServeOptions(args.enable_auto_tool_choice, args.tool_call_parser, args.reasoning_parser,
                               args.max_logprobs, names[1:], args.response_store,
                               sampling_defaults(args, llm.model_path), docs=not args.disable_fastapi_docs)
    except ValueError as e:
        sys.exit(f"error: {e}")
    if options.sampling_defaults:
        logger.info("request defaults from the generation config: %s", options.sampling_defaults)
    stats = llm.engine.stats()
    logger.info("model %s (served as %s), %s, max_model_len %d", llm.model.path, " / ".join(map(repr, names)),
                next(llm.model.model.parameters()).dtype, llm.engine.max_model_len)
    logger.info("KV cache: %d blocks of %d tokens = %d tokens", stats["blocks_total"], llm.engine.block_size,
                stats["blocks_total"] * llm.engine.block_size)
    note = spinning_note(os.environ)
    if note:
        logger.warning(note)
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

    guard = build_app(llm, names[0], api_key=args.api_key, max_body_bytes=args.max_request_bytes,
                      bind_host=args.host, on_engine_failure=stop_serving, kv_view_key=kv_view_key, options=options)
    app = guard
    if args.allowed_origins:  # outside the guard: a browser's preflight carries no key
        from starlette.middleware.cors import CORSMiddleware

        app = CORSMiddleware(guard, allow_origins=args.allowed_origins, allow_methods=args.allowed_methods,
                             allow_headers=args.allowed_headers, allow_credentials=args.allow_credentials)
    shedding = Shedding(max_connections, args.idle_timeout, args.header_timeout, args.body_timeout,
                        per_client=args.max_connections_per_client)
    config = uvicorn.Config(app, log_level=args.uvicorn_log_level or args.log_level, http=shedding.protocol,
                            backlog=backlog, timeout_graceful_shutdown=5, root_path=args.root_path,
                            ssl_keyfile=args.ssl_keyfile, ssl_certfile=args.ssl_certfile)
    server = GracefulServer(config, guard.fastapi.state.engine, args.shutdown_timeout,
                            on_start=lambda loop: loop.set_exception_handler(shedding.exception_handler))
    server.run(sockets=[sock])
    dead = guard.fastapi.state.engine.dead
    if dead is not None:
        sys.exit(f"error: the engine failed: {describe(dead)}")
