"""Record real engine runs, iteration by iteration, for the docs' block-table player and figures.

    python tools/record_runs.py build/player      # what `make docs` runs: step02.js, step04.js, step05.js

Each run is a real engine (the bundled demo model, float32, the reference attention
path, greedy) on a pool small enough to watch, with an observer (``engine.add_observer``)
that keeps, after every iteration:

* ``snapshot`` — ``take_snapshot(engine)`` (``paged/step04_sharing/snapshot.py``): the
  pools cell by cell, the queues, every sequence's block table, the KV stats;
* ``refs`` — each pool's reference counts (``BlockAllocator.ref_counts``), block ``i`` at ``i``;
* ``events`` — ``engine.events``, the iteration's decisions (admitted, allocated, cow,
  preempted, swapped out / in, finished);
* ``plan`` — the ``StepPlan`` the runner executed: per sequence its new tokens (decoded),
  its positions, its block table; the copies and swaps;
* ``sampled`` — the token each sequence drew (decoded);
* ``texts`` — each sequence's output so far (decoded).

Frame 0 is the state before the first iteration. ``record`` returns the run as a dict;
``main`` writes each run as ``<name>.js`` (``window.KV_RUNS["<name>"] = {...}``: a script,
not JSON, so the player also works from a page opened as a file) for
``tools/mkdocs_player.py`` to put into the site, and ``tools/iteration_figure.py`` draws
three iterations of the step 03 run.

Observers only read: the runs are the engine as it is, nothing replaced.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import paged  # noqa: E402, F401  (before torch: paged sets OpenMP's wait policy while it can still take effect)
import torch  # noqa: E402
from paged.models import load_model  # noqa: E402
from paged.models.default import DEFAULT_MODEL_PATH  # noqa: E402
from paged.sampling.sampling_params import SamplingParams  # noqa: E402
from paged.step04_sharing.snapshot import take_snapshot  # noqa: E402

MAX_ITERATIONS = 120  # a run longer than this is cut (none of the runs below is)


def _decode(tokenizer, ids: list[int]) -> str:
    return tokenizer.decode(ids) if ids else ""


def _plan(plan, tokenizer) -> dict:
    """The plan's lists, per scheduled sequence, with its new tokens decoded one by one."""
    seqs, start = [], 0
    for s, seq_id in enumerate(plan.seq_ids):
        q = plan.query_lens[s]
        ids = plan.input_ids[start:start + q]
        seqs.append({"seq_id": seq_id, "query_len": q, "context_len": plan.context_lens[s],
                     "positions": plan.positions[start:start + q], "tokens": [_decode(tokenizer, [t]) for t in ids],
                     "block_table": list(plan.block_tables[s]), "samples": bool(plan.sample[s])})
        start += q
    return {"seqs": seqs, "copies": [list(c) for c in plan.blocks_to_copy],
            "swap_out": [list(c) for c in plan.blocks_to_swap_out], "swap_in": [list(c) for c in plan.blocks_to_swap_in]}


def _frame(engine, tokenizer, iteration: int, plan=None, results=None) -> dict:
    s = engine.scheduler
    refs = {"device": s.kv.allocator.ref_counts()}
    if getattr(s.kv, "host", None) is not None:
        refs["host"] = s.kv.host.ref_counts()
    texts = {}
    for queue in (s.waiting, s.running, getattr(s, "swapped", [])):
        for req in queue:
            for seq in req.seqs:
                texts[seq.seq_id] = _decode(tokenizer, list(seq.output_token_ids))
    return {
        "iteration": iteration,
        "snapshot": take_snapshot(engine, max_cells=256),
        "refs": refs,
        "events": [{"kind": e.kind, "request": e.request_id, "seq": e.seq_id, "detail": e.detail}
                   for e in engine.events] if plan is not None else [],
        "plan": _plan(plan, tokenizer) if plan is not None else None,
        "sampled": {seq_id: _decode(tokenizer, [r.token_id]) for seq_id, r in (results or {}).items()},
        "texts": texts,
    }


def record(engine, tokenizer, requests: list[tuple[str, str, SamplingParams]], title: str, arrivals=None) -> dict:
    """Run ``requests`` (``(request id, prompt text, params)``) through ``engine`` to the end.

    Args:
        arrivals: ``{iteration: [request ids]}`` to add a request before that iteration instead of at
            the start (iteration 1 is the first); the others are added before the first iteration.
    """
    arrivals = arrivals or {}
    later = {rid for ids in arrivals.values() for rid in ids}
    by_id = {rid: (prompt, params) for rid, prompt, params in requests}
    prompts = {}

    def add(rid):
        prompt, params = by_id[rid]
        ids = tokenizer.encode(prompt).ids
        prompts[rid] = [_decode(tokenizer, [t]) for t in ids]
        engine.add_request(rid, ids, params)

    for rid, _, _ in requests:
        if rid not in later:
            add(rid)
    frames = [_frame(engine, tokenizer, 0)]

    def observe(engine, plan, results):
        frames.append(_frame(engine, tokenizer, len(frames), plan, results))

    engine.add_observer(observe)
    try:
        iteration = 1
        while (engine.has_unfinished() or any(i >= iteration for i in arrivals)) and iteration <= MAX_ITERATIONS:
            for rid in arrivals.get(iteration, []):
                add(rid)
            engine.step()
            iteration += 1
    finally:
        engine.remove_observer(observe)
    return {"title": title, "block_size": engine.block_size, "prompts": prompts, "frames": frames}


def demo_model():
    """The bundled demo model in float32 (a 5 M-parameter code model: fast, with a real tokenizer)."""
    return load_model(DEFAULT_MODEL_PATH, dtype=torch.float32)


def greedy(max_tokens: int, **kwargs) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, **kwargs)


# --8<-- [start:runs]
def run_step03(model) -> dict:
    """Iteration-level batching: three requests share a pool of 12 blocks of 4 tokens; a fourth
    arrives later and is admitted as soon as one has finished."""
    from paged.step03_attention import Engine

    engine = Engine(model, block_size=4, num_blocks=12, attention_backend="reference",
                    max_num_seqs=3, free_order=[5, 2, 7, 0, 9, 1, 11, 3, 8, 6, 10, 4])
    requests = [("A", "def add(a, b):", greedy(5)), ("B", "import os", greedy(9)),
                ("C", "class Point:", greedy(12)), ("D", "for i in", greedy(4))]
    return record(engine, model.tokenizer, requests, "step 03: iteration-level batching over block tables",
                  arrivals={3: ["D"]})


def run_step04(model) -> dict:
    """Sharing: a request with n=3 samples computes its 6-token prompt once, forks, and copies its
    shared, half-full last block on the first write; then a request whose prompt starts with the
    same 4 tokens maps the first one's cached block."""
    from paged.step04_sharing import SharingEngine

    engine = SharingEngine(model, block_size=4, num_blocks=16, attention_backend="reference",
                           enable_prefix_caching=True, free_order=list(range(16)))
    requests = [("P", "class Point:", SamplingParams(n=3, temperature=1.0, seed=7, max_tokens=6, ignore_eos=True)),
                ("Q", "class Point(object):", greedy(4))]
    return record(engine, model.tokenizer, requests, "step 04: fork, copy-on-write and a cached prefix",
                  arrivals={4: ["Q"]})


def run_step05(model) -> dict:
    """Preemption: three requests outgrow a pool of 8 blocks; the newest is swapped out to the host
    pool (8 blocks too), and swapped back in when the oldest finishes."""
    from paged.step02_block_table import KVCache
    from paged.step05_preemption import PreemptingEngine

    cfg = model.config
    per_block = KVCache.bytes_per_block(cfg.num_layers, 4, cfg.num_kv_heads, cfg.head_dim, torch.float32)
    engine = PreemptingEngine(model, block_size=4, num_blocks=8, attention_backend="reference",
                              preemption_mode="swap", swap_space=8 * per_block, free_order=list(range(8)))
    requests = [("A", "def add(a, b):", greedy(6)), ("B", "import os", greedy(10)),
                ("C", "class Point:", greedy(8))]
    return record(engine, model.tokenizer, requests, "step 05: preemption by swapping")
# --8<-- [end:runs]


RUNS = {"step02": run_step03, "step04": run_step04, "step05": run_step05}  # page -> run it shows


def main(out_dir: str = "build/player") -> int:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model = demo_model()
    for name, run in RUNS.items():
        data = run(model)
        text = json.dumps(data, separators=(",", ":"))
        (out / f"{name}.js").write_text(f"(window.KV_RUNS = window.KV_RUNS || {{}})[{json.dumps(name)}] = {text};\n")
        print(f"wrote {out / name}.js: {len(data['frames'])} frames, {len(text) // 1024} KiB")
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
