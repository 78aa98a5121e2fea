"""A request's ``priority`` through the server: honoured under ``--scheduling-policy priority``, refused
(400, naming the field) under the others and beyond its bounds, on each generating endpoint.

The order itself is pinned model-free in ``tests/step05_preemption/test_priority.py``; here, that the
server builds it and hands each engine request the priority its body gave. Every check is exact
(classes, priorities, status codes, error fields).
"""

import asyncio

import httpx
import pytest

from paged import LLM
from paged.models.default import DEFAULT_MODEL_PATH
from paged.serve import cli
from paged.serve.app import build_app
from paged.step05_preemption import PriorityFirst
from tests.serve.test_cli import parse

ASKS = [("/v1/completions", {"prompt": "def f(x):", "max_tokens": 2}),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}),
        ("/v1/responses", {"input": "hi", "max_output_tokens": 2})]


def test_the_flag_builds_the_priority_order():
    llm = cli.load_llm(parse(["paged/demo/model", "--num-blocks", "16", "--scheduling-policy", "priority"]))
    assert type(llm.engine.scheduler.order) is PriorityFirst


def serve(policy: str):
    """An app over the demo model ordered by ``policy``, and the priorities its engine's requests carried."""
    llm = LLM(model=str(DEFAULT_MODEL_PATH), dtype="float32", device="cpu", block_size=8, num_blocks=64, seed=0,
              scheduling_policy=policy)
    seen: dict[str, int] = {}
    llm.engine.add_observer(lambda engine, plan, results: seen.update(
        {r.request_id: r.priority for r in [*engine.scheduler.running, *engine.scheduler.waiting]}))
    return build_app(llm, "m"), seen


def ask_all(app, bodies: list[tuple[str, dict]]) -> list[httpx.Response]:
    async def go() -> list[httpx.Response]:
        app.fastapi.state.engine.start()
        try:
            transport = httpx.ASGITransport(app=app, client=("10.0.0.7", 40000))
            async with httpx.AsyncClient(transport=transport, base_url="http://server", timeout=120) as c:
                return [await c.post(route, json={"model": "m", **body}) for route, body in bodies]
        finally:
            app.fastapi.state.engine.shutdown()

    return asyncio.run(go())


def test_each_endpoint_hands_the_engine_its_priority():
    """Under ``priority``: each endpoint's request carries the priority its body gave (the 64-bit extremes
    included), 0 when it gave none."""
    app, seen = serve("priority")
    priorities = [-2 ** 63, 5, 2 ** 63 - 1, None]
    for (route, body), answers in zip(ASKS, [ask_all(app, [(route, {**body, **({} if p is None else {"priority": p})})
                                                           for p in priorities]) for route, body in ASKS]):
        assert [r.status_code for r in answers] == [200] * 4, (route, answers[0].text[:300])
    assert sorted(seen.values()) == sorted([-2 ** 63, 5, 2 ** 63 - 1, 0] * len(ASKS))


@pytest.mark.parametrize("policy, value, message", [
    ("fair", 1, "priority must be 0 here, got 1: this engine's order (FairShare) does not rank requests by "
                "priority (step05's scheduling_policy='priority' does: the server's --scheduling-policy priority)"),
    ("fcfs", -1, "priority must be 0 here, got -1"),
    ("priority", 2 ** 63, "priority must be in [-2**63, 2**63), got 9223372036854775808"),
    ("priority", "1", "priority"),
    ("priority", 1.5, "priority"),
])
def test_a_priority_the_server_cannot_honour_is_a_400_naming_it(policy, value, message):
    """Exact (status, ``param``, the message's start): nothing reaches the engine's queues."""
    app, seen = serve(policy)
    answers = ask_all(app, [(route, {**body, "priority": value}) for route, body in ASKS])
    for (route, _), r in zip(ASKS, answers):
        error = r.json()["error"]
        assert (r.status_code, error["param"]) == (400, "priority"), (route, r.text[:300])
        assert message in error["message"], (route, error["message"])
    assert seen == {}
