"""The live KV view: its event log, its throttle, and the ``/kv`` routes (exact equalities, no tolerance).

* A scripted scenario — a pair of samples forks and copies on write, a later
  request is preempted by swap and resumes — runs with ``KVView`` as the
  engine's observer: the view's log equals the engine's ``events`` of every
  iteration, in order, and the scenario's key events come out in the order
  they happened. A short log keeps exactly the newest events.
* Snapshots are taken only while someone reads and only after a read asked
  for one, at most ``max_per_second`` and no more often than the CPU budget
  allows (fake clocks for time and cost), and always when the engine loop
  goes idle. A reader that holds the latest snapshot gets only the new
  events; the advised poll interval grows once the engine has been busy.
* The server (``tests/serve/conftest.py``, with an API key and an operator
  key) serves the page openly and ``/kv/snapshot`` only to the operator's
  key, never to the API key (a client could confirm a guess at another
  client's prompt from which blocks were already cached); the snapshot
  carries the pools, queues and stats but no prompt text, and no request id a
  client chose.
"""

import asyncio
import json
import tempfile

import httpx
import pytest
import torch

from paged.models import load_model
from paged.serve.kv_view import KVView
from paged.step05_preemption import KVCache, PreemptingEngine, SamplingParams
from tests.hf_models import build_hf_model, save_checkpoint
from paged.serve.app import build_app
from tests.serve.conftest import API_KEY, KV_VIEW_KEY

OPERATOR = {"Authorization": f"Bearer {KV_VIEW_KEY}"}

B = 4
# (kind, request) in the order the scenario makes them happen
SCENARIO = [("admitted", "pair"), ("cow", "pair"), ("admitted", "late"), ("preempted", "late"),
            ("swapped_out", "late"), ("swapped_in", "late"), ("finished", "late")]


class FakeClock:
    """Seconds that move only when a test moves them, or by ``tick`` at every reading (a cost clock)."""

    def __init__(self, tick: float = 0.0) -> None:
        self.now, self.tick = 100.0, tick

    def __call__(self) -> float:
        self.now += self.tick
        return self.now


@pytest.fixture(scope="module")
def model():
    return load_model(save_checkpoint(build_hf_model("llama"), tempfile.mkdtemp()), dtype=torch.float64)


def _read(view, since: int, have: int = 0) -> dict:
    return json.loads(view.read(since, have))


def as_json(records: list) -> list:
    """``records`` as they read back from JSON (tuples become lists)."""
    return json.loads(json.dumps(records))


def _engine(model) -> PreemptingEngine:
    c = model.config
    host = 16 * KVCache.bytes_per_block(c.num_layers, B, c.num_kv_heads, c.head_dim, torch.float64)
    return PreemptingEngine(model, block_size=B, num_blocks=8, preemption_mode="swap", swap_space=host)


def _watched(model, max_tokens: int | None = 20):
    """An engine with a ``KVView`` on a fake clock (snapshots cost nothing) observing it, and one greedy
    request of ``max_tokens`` tokens (None: no request); returns ``(engine, clock, view)``."""
    engine, clock = _engine(model), FakeClock()
    view = KVView(engine, max_per_second=4, clock=clock, cost_clock=FakeClock())
    engine.add_observer(view.observe)
    if max_tokens is not None:
        engine.add_request("a", [1, 2, 3], SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True))
    return engine, clock, view


def _run_scenario(engine, view) -> list[tuple]:
    """Fork + CoW, then a later arrival preempted by swap and resumed; the engine's records, in order."""
    recorded = []
    engine.add_observer(lambda eng, plan, results: recorded.extend(
        (e.kind, e.request_id, e.seq_id, e.detail) for e in eng.events))
    engine.add_observer(view.observe)
    view.read()  # someone watches from the start: the view logs every iteration
    engine.add_request("pair", [1, 2, 3, 4, 5, 6], SamplingParams(n=2, temperature=1.0, seed=2, max_tokens=10,
                                                                  ignore_eos=True))
    engine.step()
    engine.step()
    engine.add_request("late", [7, 8, 9, 10, 11], SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))
    for _ in range(200):
        if not engine.has_unfinished():
            break
        view.read()
        engine.step()
    assert not engine.has_unfinished()
    return recorded


def test_event_log_equals_engine_events_in_scenario_order(model):
    """Exact: the log is the engine's records of every iteration, numbered 1..n; the scenario's order holds."""
    view = KVView(_engine(model), max_events=10_000)
    recorded = _run_scenario(_engine(model), view)
    log = _read(view, 0)["events"]
    assert [[e["kind"], e["request_id"], e["seq_id"], e["detail"]] for e in log] == as_json(recorded)
    assert [e["n"] for e in log] == list(range(1, len(log) + 1))
    assert [e["step"] for e in log] == sorted(e["step"] for e in log)
    keys = [(e["kind"], e["request_id"]) for e in log]
    positions = [keys.index(k) for k in SCENARIO]  # ValueError if the scenario missed a step
    assert positions == sorted(positions), positions
    assert _read(view, log[-1]["n"])["events"] == []


def test_event_log_keeps_the_newest_when_full(model):
    """Exact: with ``max_events=5`` the log holds the last five records, numbered as before."""
    view = KVView(_engine(model), max_events=5)
    recorded = _run_scenario(_engine(model), view)
    log = _read(view, 0)["events"]
    assert [[e["kind"], e["request_id"], e["seq_id"], e["detail"]] for e in log] == as_json(recorded[-5:])
    assert [e["n"] for e in log] == list(range(len(recorded) - 4, len(recorded) + 1))


def test_snapshots_only_while_watched_and_at_most_max_per_second(model):
    """Exact: no snapshot unwatched; one per 1/max_per_second of the (fake) clock; refresh takes one now."""
    engine, clock, view = _watched(model, max_tokens=20)
    first = view.latest
    engine.step()
    assert view.latest is first  # nobody has read yet
    view.read()
    engine.step()
    assert view.latest is first  # watched, but 1/4 s has not passed
    clock.now += 0.25
    engine.step()
    taken = view.latest
    snap = _read(view, 0)
    assert taken is not first and snap["step"] == 3 and snap["number"] == view.number == 2
    assert snap["queues"]["running"] == [0] and snap["requests"][0]["id"] == "a"
    view.refresh(engine)
    assert view.latest is not taken
    clock.now += 5.0  # nobody read for WATCH_TIMEOUT_S
    kept = view.latest
    engine.step()
    assert view.latest is kept


def test_snapshots_only_after_a_read_asked_for_one(model):
    """Exact: watched and due, a snapshot is taken once per read, not once per interval, and not
    before 0.25 - 0.1 s after the read (just before the reader, told 250 ms, comes back)."""
    engine, clock, view = _watched(model, max_tokens=20)
    view.read()
    clock.now += 0.25
    engine.step()
    assert view.number == 2  # the first was taken at construction
    for _ in range(3):  # still watched, due every time, but nobody read since
        clock.now += 0.25
        engine.step()
    assert view.number == 2
    view.refresh(engine)  # the engine loop went idle (snapshot 3): the next read is told 250 ms, not 2 s
    clock.now += 0.25  # the rate limit allows the next one from here on
    view.read()
    engine.step()
    assert view.number == 3  # asked for, but taken READ_LEAD_S before the reader is due back (250 ms)
    clock.now += 0.125  # before 0.25 - 0.1 s
    engine.step()
    assert view.number == 3
    clock.now += 0.05  # after it
    engine.step()
    assert view.number == 4


def test_readers_share_one_snapshot_per_interval(model):
    """Exact: two readers polling every 0.1 s while the engine is busy (told 2 s) neither delay the snapshots
    nor multiply them: the first read after a snapshot (0.1 s after it) asks for the next 1.9 s later (2 s less
    READ_LEAD_S), so one is taken every 2.1 s, as for one reader polling as told."""
    engine, clock, view = _watched(model, max_tokens=2000)
    engine.step()
    clock.now += 0.5
    engine.step()  # busy from here on: readers are told to come back in 2 s
    taken = []
    for tick in range(100):  # 10 s: each 0.1 s one of two readers reads, and the engine steps
        clock.now += 0.1
        view.read(have=view.number)
        before = view.number
        engine.step()
        if view.number > before:
            taken.append(round(tick * 0.1 + 0.1, 1))
    assert len(taken) == 4 and [round(b - a, 1) for a, b in zip(taken, taken[1:])] == [2.1] * 3


def test_cpu_budget_spaces_snapshots_by_their_cost(model):
    """Exact: a snapshot costing 5 ms of (fake) CPU is followed by the next no sooner than 5 ms / 1 % = 0.5 s."""
    engine, clock = _engine(model), FakeClock()
    view = KVView(engine, max_per_second=4, clock=clock, cost_clock=FakeClock(tick=0.005))
    assert view.cost_s == pytest.approx(0.005, abs=1e-12) and view.spacing == pytest.approx(0.5, abs=1e-9)
    engine.add_observer(view.observe)
    engine.add_request("a", [1, 2, 3], SamplingParams(temperature=0, max_tokens=20, ignore_eos=True))
    view.read()
    clock.now += 0.25  # the rate limit alone would allow one now
    engine.step()
    assert view.number == 1
    clock.now += 0.25
    engine.step()
    assert view.number == 2
    cost = _read(view, 0)["cost"]
    assert cost == {"snapshot_ms": 5.0, "total_ms": 10.0, "snapshots": 2}


def test_reader_holding_the_latest_gets_events_only_and_busy_slows_the_poll(model):
    """Exact: ``have`` = the latest number answers ``unchanged`` with the new events and no snapshot keys; a
    full answer is the latest snapshot's text; ``poll_ms`` is 250 until the engine has stepped for 0.5 s
    without a pause, then 2000, and 250 again once it went idle."""
    engine, clock, view = _watched(model, max_tokens=None)
    full = _read(view, 0)
    assert full["number"] == 1 and full["poll_ms"] == 250 and not full["busy"]
    assert {k: v for k, v in full.items() if k in json.loads(view.latest)} == json.loads(view.latest)
    engine.add_request("a", [1, 2, 3], SamplingParams(temperature=0, max_tokens=20, ignore_eos=True))
    engine.step()  # admits "a": events, but no snapshot (not due yet)
    same = _read(view, 0, have=1)
    assert same["unchanged"] is True and same["number"] == 1 and "pools" not in same and "requests" not in same
    assert [e["kind"] for e in same["events"]] == [e["kind"] for e in _read(view, 0)["events"]]
    assert "admitted" in [e["kind"] for e in same["events"]]
    clock.now += 0.49
    engine.step()  # snapshot 2, taken 0.49 s after the engine started stepping
    assert _read(view, 0)["poll_ms"] == 250
    clock.now += 0.01
    engine.step()
    busy = _read(view, 0, have=2)
    assert busy["busy"] is True and busy["poll_ms"] == 2000 and busy["unchanged"] is True
    view.refresh(engine)  # the engine loop went idle
    idle = _read(view, 0, have=2)
    assert idle["busy"] is False and idle["poll_ms"] == 250 and idle["number"] == 3 and "pools" in idle


def test_kv_page_is_open_and_snapshot_needs_the_operator_key(server):
    """The page needs no key (it holds no data); the data answers 401 without a key and with the clients' API
    key, 200 with the operator's."""
    page = httpx.get(server.url + "/kv", timeout=10)
    assert page.status_code == 200 and "kv/snapshot" in page.text and "<script>" in page.text
    assert "/kv" in httpx.get(server.url + "/", timeout=10).json()["endpoints"]
    assert httpx.get(server.url + "/kv/snapshot", timeout=10).status_code == 401
    by_client = httpx.get(server.url + "/kv/snapshot", headers={"Authorization": f"Bearer {API_KEY}"}, timeout=10)
    assert by_client.status_code == 401 and "--kv-view-key" in by_client.json()["error"]["message"]
    assert httpx.get(server.url + "/kv/snapshot", headers=OPERATOR, timeout=10).status_code == 200


def test_kv_snapshot_without_an_operator_key_is_refused_to_everyone():
    """``build_app`` without ``kv_view_key``: 403 whatever the key (and the API key opens nothing here)."""
    from paged import LLM

    llm = LLM(dtype="float32", device="cpu", block_size=8, num_blocks=16, max_model_len=48, seed=0)
    app = build_app(llm, "m", api_key="k")

    async def get(headers):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1:8000") as c:
            return await c.get("/kv/snapshot", headers=headers)
    for headers in ({}, {"Authorization": "Bearer k"}):
        r = asyncio.run(get(headers))
        assert r.status_code == 403 and r.json()["error"]["code"] == "kv_view_disabled", r.text


def test_engine_ids_in_the_kv_view_are_never_the_clients_request_id(server, client):
    """A client's ``request_id`` names its response (``cmpl-<request_id>``) but no engine request, so the
    operator's view (events, queues) never shows a string a client chose."""
    marker = "client-chosen-id-3f9a"
    first = httpx.get(server.url + "/kv/snapshot", headers=OPERATOR, timeout=10).json()  # watching from here
    r = httpx.post(server.url + "/v1/completions", headers={"Authorization": f"Bearer {API_KEY}"}, timeout=60,
                   json={"model": "test-model", "prompt": "def f(x):", "max_tokens": 4, "request_id": marker})
    assert r.status_code == 200 and r.json()["id"] == f"cmpl-{marker}"
    snap = httpx.get(server.url + f"/kv/snapshot?since={first['last_event']}", headers=OPERATOR, timeout=10)
    events = snap.json()["events"]
    assert any(e["kind"] == "admitted" for e in events), events  # the request was seen, under the server's id
    assert marker not in snap.text


def test_kv_snapshot_carries_ids_and_counts_never_text(server, client):
    """After a completion: the pools, queues and stats are there, the prompt's text is not; a bad ``since``
    is a 400 naming it."""
    prompt = "def kv_view_marker_function(x):"
    client.completions.create(model="test-model", prompt=prompt, max_tokens=4)
    resp = httpx.get(server.url + "/kv/snapshot", headers=OPERATOR, timeout=10)
    assert resp.status_code == 200
    snap = resp.json()
    assert set(snap["pools"]) == {"device", "host"}
    assert snap["pools"]["device"]["num_blocks"] == snap["stats"]["blocks_total"]
    assert set(snap["queue_lengths"]) == {"waiting", "running", "swapped"}
    assert "kv_view_marker" not in resp.text
    again = httpx.get(server.url + f"/kv/snapshot?have={snap['number']}&since={snap['last_event']}",
                      headers=OPERATOR, timeout=10).json()
    assert again["number"] >= snap["number"] and again["events"] == []
    assert again.get("unchanged") is (again["number"] == snap["number"] or None)
    bad = httpx.get(server.url + "/kv/snapshot?since=soon", headers=OPERATOR, timeout=10)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "since"
