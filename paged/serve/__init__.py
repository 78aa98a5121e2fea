"""``paged.serve``: an OpenAI-compatible HTTP server over ``paged.LLM`` (``python -m paged.serve``).

One module per endpoint, and one per piece they share. A chat request reads
forward through: ``guard`` (API key, Host, Content-Type, body size) →
``chat`` (its route) → ``body`` (bytes to the pydantic model of ``protocol``)
→ ``models`` (the model name) → ``chat_template`` (messages to prompt ids) →
``generation`` (context checks, submit to ``async_engine``, collect) or
``streaming`` (server-sent events) → ``formatter`` (engine outputs to the
models of ``schemas``); every failure on the way is mapped in ``errors``.

- :mod:`paged.serve.cli` — options, loading the model, starting uvicorn,
- :mod:`paged.serve.app` — builds the shared pieces and installs each endpoint's routes,
- :mod:`paged.serve.guard` — the ASGI guard in front of every route,
- :mod:`paged.serve.body` — parsing a body into its model, with a 400 that says what is wrong,
- :mod:`paged.serve.protocol` — the request bodies (pydantic), :mod:`paged.serve.extensions` vLLM's fields,
- :mod:`paged.serve.completions`, :mod:`paged.serve.chat` — the two generation endpoints,
- :mod:`paged.serve.models`, :mod:`paged.serve.tokenize`, :mod:`paged.serve.kv_view`,
  :mod:`paged.serve.health`, :mod:`paged.serve.metrics` — the other endpoints,
- :mod:`paged.serve.generation` — what both generation endpoints share: submit, collect,
- :mod:`paged.serve.streaming` — server-sent events,
- :mod:`paged.serve.formatter`, :mod:`paged.serve.schemas` — the response JSON and its models,
- :mod:`paged.serve.chat_template` — chat messages to a prompt (the checkpoint's template),
- :mod:`paged.serve.detokenize` — incremental detokenization and stop-string holdback,
- :mod:`paged.serve.async_engine` — the single engine thread and its queues,
- :mod:`paged.serve.offload` — the thread pool for heavy work, off the event loop,
- :mod:`paged.serve.connections`, :mod:`paged.serve.shutdown` — uvicorn's protocol shedding idle and slow
  connections, and the graceful stop on SIGTERM,
- :mod:`paged.serve.errors` — every failure as OpenAI's error JSON,
- :mod:`paged.serve.openapi` — the published document.

The engine underneath is whatever ``paged.LLM`` is (the top of the ladder);
the server uses only its public interface: ``check_request``, ``add_request``,
``step``, ``abort``, ``has_unfinished``, ``stats``, ``kv_snapshot``.
"""

from paged.extras import missing_extra

try:
    from paged.serve.app import build_app
except ModuleNotFoundError as err:  # fastapi & co. come with the serve extra: say so, and how to get it
    raise (missing_extra(err, "serve", "python -m paged.serve") or err) from None

__all__ = ["build_app"]
