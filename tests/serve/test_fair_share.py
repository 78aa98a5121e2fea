"""The server shares the device between the addresses requests come from (``FairShare``).

The order itself is pinned model-free in ``tests/step05_preemption/test_fair_share.py``; here, that the
server builds it and gives every engine request its client's address, on each generating endpoint.
Every check is exact (classes, address strings).
"""

import asyncio

import httpx

from paged import LLM
from paged.models.default import DEFAULT_MODEL_PATH
from paged.serve import cli, cli_options
from paged.serve.app import build_app
from paged.step03_attention.policies import FirstComeFirstServed
from paged.step05_preemption import FairShare
from paged.step05_preemption.engine import SCHEDULING_POLICIES
from tests.serve.test_cli import parse

ASKS = [("/v1/completions", {"prompt": "def f(x):", "max_tokens": 2}),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}),
        ("/v1/responses", {"input": "hi", "max_output_tokens": 2})]
CLIENTS = [("10.0.0.7", "10.0.0.7"), ("10.0.0.8", "10.0.0.8"), ("2001:db8::7", "2001:db8::/64")]  # (peer, client)


def test_the_server_orders_by_fair_share_unless_told_fcfs():
    """Exact (classes): the server's default builds ``FairShare``, ``--scheduling-policy fcfs`` the paper's
    order; the parser's policies are the engine's (named twice so that ``--help`` imports no engine)."""
    assert set(cli_options.SCHEDULING_POLICIES) == set(SCHEDULING_POLICIES)
    default = cli.load_llm(parse(["paged/demo/model", "--num-blocks", "16"]))
    assert type(default.engine.scheduler.order) is FairShare
    fcfs = cli.load_llm(parse(["paged/demo/model", "--num-blocks", "16", "--scheduling-policy", "fcfs"]))
    assert type(fcfs.engine.scheduler.order) is FirstComeFirstServed


def test_every_generating_endpoint_gives_its_request_the_peers_address():
    """Each endpoint asked from 10.0.0.7, 10.0.0.8 and 2001:db8::7 (the ASGI client's address): the
    engine's requests, seen while running, carry exactly those clients (the IPv6 one as its /64)."""
    llm = LLM(model=str(DEFAULT_MODEL_PATH), dtype="float32", device="cpu", block_size=8, num_blocks=64, seed=0,
              scheduling_policy="fair")
    seen: dict[str, str] = {}
    llm.engine.add_observer(lambda engine, plan, results: seen.update(
        {r.request_id: r.client for r in engine.scheduler.running}))
    app = build_app(llm, "m")

    async def ask(address: str, route: str, body: dict) -> None:
        transport = httpx.ASGITransport(app=app, client=(address, 40000))
        async with httpx.AsyncClient(transport=transport, base_url="http://server", timeout=120) as c:
            r = await c.post(route, json={"model": "m", **body})
            assert r.status_code == 200, (route, r.text[:300])

    async def go() -> None:
        app.fastapi.state.engine.start()
        try:
            for route, body in ASKS:
                for address, client in CLIENTS:
                    before = set(seen)
                    await ask(address, route, body)
                    assert {seen[rid] for rid in set(seen) - before} == {client}, route
        finally:
            app.fastapi.state.engine.shutdown()

    asyncio.run(go())
    assert len(seen) == len(CLIENTS) * len(ASKS)
