"""``GET /``: what this server serves — a small page for a browser, the same as JSON for anything else.

A person who opens the server's address in a browser (which asks for
``text/html``) gets a page naming the model and linking the live KV view
(``/kv``), the API's interactive documentation (``/docs``), the metrics, the
model list and the tutorial; a client (``Accept: application/json``, ``*/*`` or
none) gets the ``Index`` JSON. The page holds no data a client could not read
from ``/v1/models``, so it needs no key.
"""

from __future__ import annotations

import html

from fastapi import Request
from fastapi.responses import HTMLResponse

from paged.serve.schemas import Index

TUTORIAL = "http://127.0.0.1:8001/"  # `make docs`, then `.venv/bin/mkdocs serve -a 127.0.0.1:8001`
PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>paged: {model}</title>
<style>body{{font:16px/1.5 system-ui,sans-serif;max-width:42rem;margin:3rem auto;padding:0 1rem}}
code{{background:#f3f3f3;padding:0 .2em}}li{{margin:.3em 0}}</style></head>
<body><h1>paged</h1>
<p>An OpenAI-compatible server over paged's PagedAttention engine, serving <code>{model}</code>.</p>
<ul>
<li><a href="/kv">/kv</a>: the live KV cache view (the operator's key opens its data)</li>
{docs}<li><a href="/metrics">/metrics</a>: Prometheus metrics (vLLM's names)</li>
<li><a href="/v1/models">/v1/models</a>, <a href="/health">/health</a>, <a href="/version">/version</a></li>
<li>the tutorial: <code>docs/</code> in the source (<code>make docs</code>, then
<code>.venv/bin/mkdocs serve -a 127.0.0.1:8001</code> serves it at <a href="{tutorial}">{tutorial}</a>)</li>
</ul>
<p>Try it: <code>curl {base}v1/completions -H 'Content-Type: application/json' -d '{{"model": "{model}",
"prompt": "def add(a, b):", "max_tokens": 16}}'</code></p>
</body></html>
"""


def wants_html(accept: str) -> bool:
    """A browser's ``Accept``: ``text/html`` named before any JSON type (``*/*`` alone is a client's)."""
    kinds = [part.split(";")[0].strip().lower() for part in accept.split(",")]
    html_at = kinds.index("text/html") if "text/html" in kinds else None
    json_at = next((i for i, k in enumerate(kinds) if k == "application/json"), None)
    return html_at is not None and (json_at is None or html_at < json_at)


def install(app, model: str, endpoints: list[str], docs: bool) -> None:
    """Add ``GET /`` to ``app``."""

    @app.get("/", tags=["server"], summary="What this server serves (HTML for a browser)",
             responses={200: {"content": {"text/html": {"schema": {"type": "string"}}},
                              "description": "the Index as JSON, or a page when the client asks for HTML"}})
    async def root(raw: Request) -> Index:
        if wants_html(raw.headers.get("accept", "")):
            shown = html.escape(model)
            links = '<li><a href="/docs">/docs</a>: the API, interactive (OpenAPI)</li>\n' if docs else ""
            return HTMLResponse(PAGE.format(model=shown, docs=links, tutorial=TUTORIAL, base=html.escape(
                str(raw.base_url))))
        return Index(name="paged", model=model, endpoints=endpoints)
