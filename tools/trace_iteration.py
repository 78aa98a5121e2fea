"""Which files and functions one iteration's scheduling decision passes through.

    python tools/trace_iteration.py [--model PATH] [--json]

Builds the engine ``python -m paged.serve`` builds at its defaults (``paged.LLM``: the
final engine, prefix caching on, preemption on; with the server's own two settings: chunks
cut to a time, fair share), queues one prompt, and traces with
``sys.setprofile`` two iterations: the one that computes the prompt (a prefill) and the
next one (a decode). Only the scheduling decision is counted: the calls made under the
engine's ``step`` outside the runner's ``execute`` (the forward pass and the sampler are
the worker's, not the decision). Prints, per iteration, the files of ``paged/`` entered
and the functions of each, each file under its role:

* the decision: the engine, the scheduler, the KV manager, the components;
* the block state the KV manager owns (allocators, block tables, the prefix cache);
* plain data (requests, sequences, the plan) and the sampling states.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


ROLES = (  # (role, file name patterns), the first that matches
    ("engine", ("engine.py",)),
    ("scheduler", ("scheduler.py",)),
    ("KV manager", ("kv_manager.py", "block_manager.py", "swap.py")),
    ("component", ("policies.py", "chunked.py", "decoding.py", "policy.py", "beam.py", "fair.py", "priority.py",
                   "iteration_cost.py")),
    ("block state", ("allocator.py", "block_table.py", "cow_table.py", "prefix_cache.py")),
)


def role(path: str) -> str:
    name = Path(path).name
    return next((r for r, names in ROLES if name in names), "data")


def trace_step(engine) -> dict[str, list[str]]:
    """Run ``engine.step()`` under a profiler; ``{file: [function, ...]}`` of the decision's calls."""
    paged_dir = str(ROOT / "paged")
    runner_execute = type(engine.runner).execute.__code__
    seen: dict[str, set[str]] = defaultdict(set)
    depth_in_runner = 0

    def profile(frame, event, arg):
        nonlocal depth_in_runner
        if event not in ("call", "return"):
            return
        code = frame.f_code
        if code is runner_execute:
            depth_in_runner += 1 if event == "call" else -1
            return
        if event == "call" and depth_in_runner == 0 and code.co_filename.startswith(paged_dir):
            rel = str(Path(code.co_filename).relative_to(ROOT))
            seen[rel].add(code.co_qualname)

    sys.setprofile(profile)
    try:
        engine.step()
    finally:
        sys.setprofile(None)
    return {f: sorted(fns) for f, fns in sorted(seen.items())}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="a model path (default: the server's default model)")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args(argv)

    from paged import LLM, SamplingParams
    from paged.models.default import default_model
    from paged.serve.cli_options import SERVE_LONG_PREFILL_SECONDS, SERVE_SCHEDULING_POLICY

    llm = LLM(model=args.model or default_model()[0], dtype="bfloat16", long_prefill_seconds=SERVE_LONG_PREFILL_SECONDS,
              scheduling_policy=SERVE_SCHEDULING_POLICY)
    engine = llm.engine
    prompt = list(range(10, 10 + 40))
    engine.add_request("traced", prompt, SamplingParams(temperature=0, max_tokens=4))
    report = {"prefill": trace_step(engine), "decode": trace_step(engine)}
    if args.json:
        print(json.dumps(report))
        return 0
    for name, files in report.items():
        total = sum(len(f) for f in files.values())
        print(f"{name}: {len(files)} files, {total} functions")
        for r in [r for r, _ in ROLES] + ["data"]:
            mine = {f: fns for f, fns in files.items() if role(f) == r}
            print(f"  {r}: {len(mine)} files, {sum(len(v) for v in mine.values())} functions")
            for f, fns in mine.items():
                print(f"    {f} ({len(fns)}): {', '.join(fns)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
