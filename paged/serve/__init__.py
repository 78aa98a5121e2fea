"""``paged.serve``: an OpenAI-compatible HTTP server over ``paged.LLM`` (``python -m paged.serve``).

One idea per file:

- :mod:`paged.serve.cli` — options, loading the model, starting uvicorn,
- :mod:`paged.serve.app` — routes, the API-key / body-size guard, body parsing,
- :mod:`paged.serve.protocol` — the request bodies (pydantic),
- :mod:`paged.serve.completions` — completions and chat: validate, submit, stream or collect,
- :mod:`paged.serve.responses` — OpenAI's response, chunk and logprobs JSON,
- :mod:`paged.serve.chat` — chat messages to a prompt (chat template or default),
- :mod:`paged.serve.async_engine` — the single engine thread and its queues,
- :mod:`paged.serve.detokenize` — incremental detokenization and stop-string holdback,
- :mod:`paged.serve.metrics` — ``/metrics`` (Prometheus),
- :mod:`paged.serve.errors` — OpenAI-shaped errors.

The engine underneath is whatever ``paged.LLM`` is (the top of the ladder);
the server uses only its public interface: ``check_request``, ``add_request``,
``step``, ``abort``, ``has_unfinished``, ``stats``.
"""

from paged.serve.app import build_app

__all__ = ["build_app"]
