"""``GET /health``: is the engine running?

It answers 200 while the engine thread runs and 503, with the engine's error,
once a step has failed (the server takes no more requests then). It needs no
API key: probes and supervisors read it.
"""

from __future__ import annotations

from paged.serve.async_engine import describe
from paged.serve.errors import APIError
from paged.serve.openapi import error_responses
from paged.serve.schemas import Health


def install(app, engine) -> None:
    """Add ``GET /health`` (over the ``AsyncEngine``) to ``app``."""

    @app.get("/health", tags=["server"], summary="Is the engine running?",
             responses=error_responses(_503="the engine failed; the message says how"))
    async def health() -> Health:
        if engine.dead is not None:
            raise APIError(f"the engine failed: {describe(engine.dead)}", 503)
        return Health()
