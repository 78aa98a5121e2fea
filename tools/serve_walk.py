"""The serve walk: which modules of ``paged/serve`` one non-streamed chat request passes through, and how often.

Builds the app in-process over the demo model (``build_app``), sends one chat request through
httpx's ASGI transport to warm everything up, then sends the same request again with
``sys.setprofile`` on the event loop's thread (the engine thread's forward pass is not
traced: it is not serve code). Every Python call and return whose code lies in
``paged/serve/`` is an event; the other frames (FastAPI, pydantic, the standard library) are
looked through, so a call is attributed to the nearest serve frame below it. Per module:

* ``entries``: calls into the module from another serve module or from outside serve;
* ``returns``: control coming back into the module from a function of another serve module;
* ``inner``: calls from the module into itself.

``visits`` = entries + returns: how many times a reader following the request arrives in
that module. The walk is the sequence of modules in the order they are arrived in.

Two tables: the *reader's* walk counts calls and returns only, the way one reads the code;
the *loop's* walk also counts each time the event loop suspends a coroutine at an ``await``
and resumes it (a resumed coroutine re-enters every frame of its await chain).

    python tools/serve_walk.py [--root CHECKOUT] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from collections import Counter
from pathlib import Path

BODY = {"model": "m", "messages": [{"role": "user", "content": "Write a function."}], "max_tokens": 4,
        "temperature": 0}


def walk_of(events: list, resumes: bool):
    """``(rows, total, walk)`` of the traced ``events``; without ``resumes``, a coroutine's suspension at an
    ``await`` and its resumption are not counted (only real calls and returns)."""
    seen, resumed_at, later_resumed = set(), set(), set()
    for i, (event, _, _, frame) in enumerate(events):
        if event == "call":
            if frame in seen:
                resumed_at.add(i)
            seen.add(frame)
    last_return: dict[int, int] = {}
    for i, (event, _, _, frame) in enumerate(events):
        if event == "return":
            last_return[frame] = i
        elif i in resumed_at:
            later_resumed.add(last_return[frame])  # that return was a suspension
    entries, returns, inner, walk = Counter(), Counter(), Counter(), []

    def arrive(mod: str) -> None:
        if not walk or walk[-1] != mod:
            walk.append(mod)

    for i, (event, mod, caller, _) in enumerate(events):
        if not resumes and (i in resumed_at or i in later_resumed):
            continue
        if event == "call":
            if caller == mod:
                inner[mod] += 1
            else:
                entries[mod] += 1
                arrive(mod)
        elif caller is not None and caller != mod:
            returns[caller] += 1
            arrive(caller)
    mods = sorted(set(entries) | set(returns) | set(inner), key=lambda m: -(entries[m] + returns[m]))
    rows = {m: {"entries": entries[m], "returns": returns[m], "visits": entries[m] + returns[m], "inner": inner[m]}
            for m in mods}
    total = {k: sum(r[k] for r in rows.values()) for k in ("entries", "returns", "visits", "inner")}
    return rows, total, walk


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--root", default=str(Path(__file__).resolve().parents[1]), help="the checkout to trace")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    root = Path(args.root).resolve()
    sys.path.insert(0, str(root))
    os.chdir(root)
    import httpx

    from paged import LLM
    from paged.demo import DEFAULT_MODEL_PATH
    from paged.serve.app import build_app

    serve_dir = str(root / "paged" / "serve") + os.sep
    llm = LLM(model=str(DEFAULT_MODEL_PATH), dtype="float32", device="cpu", block_size=8, num_blocks=64, seed=0)
    app = build_app(llm, "m")
    events = []  # (event, module, serve caller's module, frame), in order
    frames = []  # every frame seen, kept alive so that id() is not reused

    def module(frame) -> str | None:
        path = frame.f_code.co_filename
        return path[len(serve_dir):] if path.startswith(serve_dir) else None

    def serve_caller(frame) -> str | None:
        frame = frame.f_back
        while frame is not None:
            mod = module(frame)
            if mod is not None:
                return mod
            frame = frame.f_back
        return None

    def profile(frame, event, arg):
        if event not in ("call", "return"):
            return
        mod = module(frame)
        if mod is not None:
            frames.append(frame)
            events.append((event, mod, serve_caller(frame), id(frame)))

    async def run() -> int:
        app.fastapi.state.engine.start()
        try:
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1:8000", timeout=120) as c:
                (await c.post("/v1/chat/completions", json=BODY)).raise_for_status()
                sys.setprofile(profile)
                try:
                    r = await c.post("/v1/chat/completions", json=BODY)
                finally:
                    sys.setprofile(None)
                r.raise_for_status()
                return r.status_code
        finally:
            app.fastapi.state.engine.shutdown()

    asyncio.run(run())
    tables = {"reader": walk_of(events, resumes=False), "loop": walk_of(events, resumes=True)}
    for name, (rows, total, walk) in tables.items():
        what = "calls and returns" if name == "reader" else "calls, returns, suspensions and resumes"
        print(f"\nserve walk of one non-streamed chat request ({name}: {what}), {root}")
        print(f"{'module':24s} {'entries':>8s} {'returns':>8s} {'visits':>8s} {'inner':>8s}")
        for m, r in rows.items():
            print(f"{m:24s} {r['entries']:8d} {r['returns']:8d} {r['visits']:8d} {r['inner']:8d}")
        print(f"{'total':24s} {total['entries']:8d} {total['returns']:8d} {total['visits']:8d} {total['inner']:8d}")
        print(f"modules: {len(rows)}; arrivals in order ({len(walk)}): "
              + " > ".join(m.removesuffix(".py") for m in walk))
    if args.json:
        print(json.dumps({name: {"modules": rows, "total": total, "walk": walk}
                          for name, (rows, total, walk) in tables.items()}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
