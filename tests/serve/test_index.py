"""``GET /``: a page for a browser (links to /kv, /docs, /metrics and the tutorial), JSON for a client.

In-process on the demo model. A browser's ``Accept`` (Chromium's own header)
gets HTML naming the model (escaped) and linking each place; ``*/*``, JSON
or no header gets the ``Index`` JSON, as before. Without the docs
(``--disable-fastapi-docs``) the page does not link them and ``/docs`` is a 404.
"""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from paged import LLM
from paged.demo import DEFAULT_MODEL_PATH
from paged.serve.app import build_app
from paged.serve.index import TUTORIAL
from paged.serve.options import ServeOptions

CHROMIUM = "text/html,application/xhtml+xml,application/xml;q=0.9,image/avif,image/webp,*/*;q=0.8"


@pytest.fixture(scope="module")
def llm():
    return LLM(str(DEFAULT_MODEL_PATH), dtype="float32", device="cpu", block_size=8, num_blocks=32)


def test_a_browser_gets_a_page_linking_everything(llm):
    with TestClient(build_app(llm, "<demo>")) as c:
        r = c.get("/", headers={"Accept": CHROMIUM})
        assert r.headers["content-type"].startswith("text/html")
        for link in ('href="/kv"', 'href="/docs"', 'href="/metrics"', 'href="/v1/models"', f'href="{TUTORIAL}"'):
            assert link in r.text, link
        assert "&lt;demo&gt;" in r.text and "<demo>" not in r.text
        for accept in ("*/*", "application/json", "application/json, text/html", None):
            r = c.get("/", headers={"Accept": accept} if accept else {})
            assert r.json()["model"] == "<demo>" and "/v1/responses" in r.json()["endpoints"], accept


def test_without_the_docs_the_page_does_not_link_them(llm):
    with TestClient(build_app(llm, "m", options=ServeOptions(docs=False))) as c:
        assert 'href="/docs"' not in c.get("/", headers={"Accept": CHROMIUM}).text
        assert c.get("/docs").status_code == c.get("/openapi.json").status_code == 404
