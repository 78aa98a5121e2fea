"""``GET /health``: is the engine running? ``GET /version``: which server is this?

It answers 200 while the engine thread runs and 503, with the engine's error,
once a step has failed (the server takes no more requests then). It needs no
API key: probes and supervisors read it. ``/version`` answers vLLM's shape,
``{"version": ...}``, with this package's version (tools that know vLLM read it).
"""

from __future__ import annotations

from paged.serve.async_engine import describe
from paged.serve.errors import APIError
from paged.serve.openapi import error_responses
from paged.serve.schemas import Health, Version


def install(app, engine, version: str = "0") -> None:
    """Add ``GET /health`` (over the ``AsyncEngine``) and ``GET /version`` to ``app``."""

    @app.get("/version", tags=["server"], summary="This server's version")
    async def server_version() -> Version:
        return Version(version=version)

    @app.get("/health", tags=["server"], summary="Is the engine running?",
             responses=error_responses(_503="the engine failed; the message says how"))
    async def health() -> Health:
        if engine.dead is not None:
            raise APIError(f"the engine failed: {describe(engine.dead)}", 503)
        return Health()
