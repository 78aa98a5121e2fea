"""Semantic fuzzing of the live server: requests built to be expensive or to break a parser.

Schemathesis (``test_schemathesis.py``) draws requests from the published
types; this test draws from what hurts an engine instead
(``tests/strategies.py::hostile_requests``): recursive and huge JSON schemas,
regex bombs, choice lists past llguidance's row limit, lists of every size
around their bounds, extreme numbers (2**63, 1e308, 5e-324), bodies nested
20 000 deep, 5 000-digit integers, non-ASCII digits as token ids — one to three
of them in an otherwise valid request. After every request:

* its answer is not a 5xx (a 4xx names its field; a 200 is fine);
* a plain 1-token request sent at the same time was served;
* ``/health`` answers 200 (the engine thread is alive);
* once idle, no KV block is in use.

Hypothesis is derandomized: the suite runs the same ``PAGED_SEMANTIC_FUZZ_EXAMPLES``
(default 16) examples every time; ``make fuzz`` runs 2 000 and prints the statuses seen.
"""

from __future__ import annotations

import json
import os
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from hypothesis import HealthCheck, given, settings

from tests.serve.conftest import API_KEY
from tests.serve.test_hostile_requests import BASE, wait_idle
from tests.strategies import hostile_requests

pytestmark = pytest.mark.step05

AUTH = {"Authorization": f"Bearer {API_KEY}", "Content-Type": "application/json"}
EXAMPLES = int(os.environ.get("PAGED_SEMANTIC_FUZZ_EXAMPLES", "16"))
REQUEST_TIMEOUT_S = 60  # a hostile request that is admitted still runs at most 6 tokens


@pytest.fixture(scope="module")
def clients(server):
    with httpx.Client(base_url=server.url, headers=AUTH, timeout=REQUEST_TIMEOUT_S) as hostile, \
            httpx.Client(base_url=server.url, headers=AUTH, timeout=REQUEST_TIMEOUT_S) as plain:
        yield hostile, plain


def test_semantic_fuzz_no_request_hurts_the_server(server, clients):
    hostile, plain = clients
    seen: Counter = Counter()
    slowest = [0.0]

    @settings(max_examples=EXAMPLES, derandomize=True, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(hostile_requests())
    def one(case):
        path, body = case
        raw = body if isinstance(body, bytes) else json.dumps(body).encode()
        with ThreadPoolExecutor(2) as pool:
            beside = pool.submit(plain.post, "/v1/completions", json={**BASE, "max_tokens": 1, "temperature": 0})
            t0 = time.monotonic()
            r = hostile.post(path, content=raw)
            slowest[0] = max(slowest[0], time.monotonic() - t0)
            served = beside.result()
        seen[r.status_code] += 1
        assert r.status_code < 500, (r.status_code, r.text[:400], raw[:400])
        assert served.status_code == 200, (served.status_code, served.text[:300], raw[:400])
        assert httpx.get(server.url + "/health", timeout=10).status_code == 200
        assert wait_idle(server) == 0, raw[:400]

    one()
    print(f"\nsemantic fuzz: {sum(seen.values())} requests, statuses {dict(sorted(seen.items()))}, "
          f"slowest answer {slowest[0]:.2f}s")
