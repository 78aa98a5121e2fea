"""The Orca reservation modes inside the engine (``paged.bench.reservation``), the serving client, and smoke runs of the
``throughput`` and ``hf`` benchmarks.

Reservation accounting is exact (integers); the client's timings are checked against a fake server
that sleeps known intervals, with bounds wide enough for a loaded 2-core machine.
"""

import asyncio
import json
import threading

import pytest

from paged.bench import e2e, hf, serve, throughput
from paged.bench.__main__ import main as bench_main
from paged.models.random_llama import load_random_llama
from paged.step03_attention import SamplingParams
from paged.bench.reservation import ReservingEngine
from paged.errors import RequestError
from paged.step05_preemption import PreemptingEngine

B, CONTEXT = 4, 64


@pytest.fixture(scope="module")
def model():
    return load_random_llama(max_position_embeddings=CONTEXT)


def _engine(model, memory, num_blocks=64, **kw):
    return ReservingEngine(model, memory=memory, block_size=B, num_blocks=num_blocks, max_model_len=CONTEXT, **kw)


def _params(max_tokens, **kw):
    return SamplingParams(max_tokens=max_tokens, ignore_eos=True, **{"temperature": 0.0, **kw})


# prompt 5 + 7 generated = 12 tokens: oracle 12 slots = 3 blocks, pow2 16 = 4 blocks, max 64 = 16 blocks
@pytest.mark.parametrize("memory, blocks", [("orca-oracle", 3), ("orca-pow2", 4), ("orca-max", 16)])
@pytest.mark.parametrize("n", [1, 2])
def test_reservation_reserves_what_the_mode_claims(model, memory, blocks, n):
    eng = _engine(model, memory)
    assert eng.reservation(5, _params(7, n=n, best_of=n, temperature=1.0)) == (n, blocks)
    eng.add_request("a", [3, 4, 5, 6, 7], _params(7, n=n, best_of=n, temperature=1.0))
    eng.step()
    assert eng.reserved_blocks("a") == n * blocks
    assert eng.stats()["blocks_reserved"] == n * blocks
    held = []
    while eng.has_unfinished():  # held until the end, never exceeded
        assert eng.reserved_blocks("a") == n * blocks
        held.append(eng.scheduler.kv.allocator.num_used)
        eng.step()
    assert max(held) <= n * blocks
    assert eng.reservations == {} and eng.arena.num_allocated == 0


def test_reservation_admits_only_what_fits_and_paged_admits_more(model):
    """16 blocks; each request (4 + 4 tokens) reserves 16 (max), 2 (oracle); paged takes 1 block per prompt."""
    prompts = [[3 + i, 4, 5, 6] for i in range(10)]
    running = {}
    for memory in ("paged", "orca-oracle", "orca-max"):
        eng = _engine(model, memory, num_blocks=16)
        for i, p in enumerate(prompts):
            eng.add_request(str(i), p, _params(4))
        eng.step()
        running[memory] = len(eng.scheduler.running)
        if memory != "paged":
            assert eng.arena.num_allocated == sum(eng.reserved_blocks(r.request_id) for r in eng.scheduler.running)
    assert running == {"paged": 10, "orca-oracle": 8, "orca-max": 1}


def test_reservation_outputs_equal_paged_and_never_preempt(model):
    """Same kernels, runner and scheduler: greedy outputs bitwise equal across modes; Orca never preempts."""
    outs = {}
    for memory in ("paged", "orca-oracle", "orca-pow2", "orca-max"):
        eng = _engine(model, memory, num_blocks=20)
        for i in range(6):
            eng.add_request(str(i), [3 + i] * (3 + i), _params(9 + i))
        done = {}
        while eng.has_unfinished():
            for o in eng.step():
                if o.finished:
                    done[o.request_id] = o.outputs[0].token_ids
        outs[memory] = done
        if memory != "paged":
            assert sum(eng.scheduler.preemptions.values()) == 0
    assert all(o == outs["paged"] for o in outs.values())


def test_reservation_refuses_what_can_never_fit_and_bad_modes(model):
    eng = _engine(model, "orca-max", num_blocks=15)  # a 16-block chunk cannot be placed in 15 blocks
    with pytest.raises(RequestError, match="can never hold") as err:
        eng.add_request("a", [3, 4], _params(2))
    assert (err.value.param, err.value.bound) == ("max_tokens", 15)
    assert not eng.has_unfinished()
    with pytest.raises(ValueError, match="memory must be one of"):
        _engine(model, "orca")
    with pytest.raises(ValueError, match="prefix"):
        _engine(model, "orca-max", enable_prefix_caching=True)


def test_paged_mode_plans_exactly_as_the_preempting_engine(model):
    """``memory="paged"`` adds nothing to admission: every plan of a run that preempts is equal
    (same sequences, positions, slots, block tables, swaps) to ``PreemptingEngine``'s."""
    def plans(engine):
        seen = []
        engine.add_observer(lambda e, plan, results: seen.append(
            (plan.seq_ids, plan.positions, plan.slot_mapping, plan.block_tables, plan.blocks_to_swap_out,
             plan.blocks_to_swap_in, plan.blocks_to_copy)))
        for i in range(6):
            engine.add_request(str(i), [3 + i] * (5 + i), _params(12 + i, n=1 + i % 2, best_of=1 + i % 2,
                                                                  temperature=0.7, seed=i))
        while engine.has_unfinished():
            engine.step()
        return seen, sum(engine.scheduler.preemptions.values())

    got, preempted = plans(_engine(model, "paged", num_blocks=12))
    want, _ = plans(PreemptingEngine(model, block_size=B, num_blocks=12, max_model_len=CONTEXT))
    assert preempted > 0 and got == want


# -- the serving client against a fake server with known timings ----------------------------------
TTFT, GAP = 0.20, 0.05


async def _fake_server(reader, writer):
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    length = next((int(x.split(":")[1]) for x in lines if x.lower().startswith("content-length")), 0)
    body = json.loads(await reader.readexactly(length)) if length else {}
    if lines[0].startswith("GET /v1/models"):
        data = json.dumps({"object": "list", "data": [{"id": "fake"}]}).encode()
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
                     + str(len(data)).encode() + b"\r\nConnection: close\r\n\r\n" + data)
    elif not lines[0].startswith("POST /v1/completions "):
        writer.write(b"HTTP/1.1 404 Not Found\r\nContent-Length: 9\r\nConnection: close\r\n\r\nnot found")
    else:
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n")
        n = body["max_tokens"]
        await asyncio.sleep(TTFT)
        for i in range(n):
            if i:
                await asyncio.sleep(GAP)
            writer.write(b"data: " + json.dumps({"choices": [{"index": 0, "text": "x"}]}).encode() + b"\n\n")
            await writer.drain()
        usage = {"choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": n}}
        writer.write(b"data: " + json.dumps(usage).encode() + b"\n\ndata: [DONE]\n\n")
    await writer.drain()
    writer.close()


@pytest.fixture(scope="module")
def fake_server():
    loop = asyncio.new_event_loop()
    server = loop.run_until_complete(asyncio.start_server(_fake_server, "127.0.0.1", 0))
    port = server.sockets[0].getsockname()[1]
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{port}"
    loop.call_soon_threadsafe(loop.stop)
    thread.join(5)


def test_serve_client_metrics_match_the_servers_timings(fake_server):
    jobs = [e2e.Job([3, 4], 5), e2e.Job([3], 3), e2e.Job([5, 6, 7], 4)]
    results, duration = asyncio.run(serve.benchmark(fake_server, None, jobs, max_concurrency=2))
    m = serve.summarize(results, duration)
    assert (m["completed"], m["failed"]) == (3, 0)
    assert [r.output_tokens for r in results] == [5, 3, 4]
    assert TTFT * 1000 <= m["ttft_ms"]["mean"] < TTFT * 1000 + 150
    assert GAP * 1000 * 0.8 <= m["itl_ms"]["p50"] < GAP * 1000 + 60
    assert GAP * 1000 * 0.8 <= m["tpot_ms"]["mean"] < GAP * 1000 + 60
    for r in results:  # e2e = ttft + (n - 1) gaps
        assert TTFT + (r.output_tokens - 1) * GAP * 0.8 <= r.e2e < TTFT + (r.output_tokens - 1) * GAP + 0.3
        assert len(r.itl) == r.output_tokens - 1
    # two slots for three requests: the third (4 tokens) starts when the second (3 tokens) ends
    assert duration >= 2 * TTFT + (2 + 3) * GAP * 0.8
    assert m["normalized_latency_s"] == pytest.approx(sum(r.e2e / r.output_tokens for r in results) / 3)


def test_serve_client_counts_a_failed_request(fake_server):
    results, duration = asyncio.run(serve.benchmark(fake_server + "/nowhere", "fake", [e2e.Job([3], 2)]))
    assert not results[0].ok and results[0].error.startswith("HTTP 404")
    assert serve.summarize(results, duration)["failed"] == 1


def test_serve_arrivals_have_the_requested_rate():
    gaps = serve.arrival_gaps(4000, 10.0, 0.5, seed=1)
    assert sum(gaps) / len(gaps) == pytest.approx(0.1, rel=0.1)
    assert serve.arrival_gaps(3, float("inf"), 1.0, 0) == [0.0] * 3
    with pytest.raises(ValueError):
        serve.arrival_gaps(3, 0.0, 1.0, 0)


# -- the benchmarks end to end -------------------------------------------------------------------
def test_max_rate_interpolates_the_crossing():
    assert throughput.max_rate([(1, 0.1), (2, 0.2), (4, 0.6)], 0.4) == (3.0, "")
    assert throughput.max_rate([(1, 0.5), (2, 0.6)], 0.4) == (1, "<")
    assert throughput.max_rate([(1, 0.1), (2, 0.2)], 0.4) == (2, ">=")


def test_throughput_smoke_json(capsys):
    assert bench_main(["throughput", "--num-requests", "12", "--rates", "20,400", "--kv-tokens", "600",
                       "--threshold", "0.05", "--json"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["trace"] == "sharegpt" and out["decoding"] == "basic"
    assert set(out["systems"]) == {"paged", "orca_oracle", "orca_pow2", "orca_max"}
    for m in out["systems"].values():
        assert set(m) == {"max_rate", "mean_batched_requests", "tokens_per_s"}
        assert m["tokens_per_s"] > 0
    # all requests present at the top rate: memory decides the batch, paged's is the largest
    s = out["systems"]
    assert s["paged"]["mean_batched_requests"] > s["orca_max"]["mean_batched_requests"]


def test_throughput_smoke_beam(capsys):
    assert bench_main(["throughput", "--trace", "alpaca", "--decoding", "beam-2", "--num-requests", "6",
                       "--rates", "100", "--systems", "paged,orca-oracle", "--json"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["decoding"] == "beam-2" and set(out["systems"]) == {"paged", "orca_oracle"}


def test_hf_smoke_json(capsys):
    assert bench_main(["hf", "--num-requests", "6", "--no-continuous", "--json"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert set(out["systems"]) == {"paged", "hf_static"}
    assert out["systems"]["paged"]["output_tokens"] == out["systems"]["hf_static"]["output_tokens"]
    assert out["ratios"]["paged_over_hf_static"] > 0


def test_static_batches_fit_the_budget():
    jobs = [e2e.Job([3] * p, o) for p, o in [(10, 20), (5, 40), (30, 10), (2, 2)]]
    batches = hf.static_batches(jobs, 100)
    # (10, 20) then + (5, 40): 2 x 50 = 100 fits; + (30, 10): 3 x 70 does not; then (30, 10) + (2, 2): 2 x 40
    assert [[(len(j.prompt), j.output_len) for j in b] for b in batches] == [[(10, 20), (5, 40)], [(30, 10), (2, 2)]]
