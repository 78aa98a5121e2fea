"""Draw a Grafana dashboard's panels from a real Prometheus scraping this server (no Grafana needed).

    python tools/dashboard_check.py --dashboard grafana.json --prometheus http://127.0.0.1:9090 \\
        --server http://127.0.0.1:8000 --model paged-demo --load-seconds 120 --out build/dashboard.png

vLLM publishes an example Grafana dashboard for its metrics. This script reads
such a dashboard's JSON (its panels, their PromQL ``expr`` s and legends, its
``$model_name`` variable), optionally sends the server a mixed load for
``--load-seconds`` (completions and chats of several lengths, some sharing a
prefix, some streamed), then evaluates every query as Grafana would — through
Prometheus' range-query API, ``$model_name`` set to ``--model`` and
``$__rate_interval`` to ``--rate-interval`` — and draws each panel as a chart
in one PNG. It prints, per panel, how many series came back with data, and
exits 1 if a panel of the dashboard stayed empty. Prometheus must scrape the
server's ``/metrics`` (a ``scrape_configs`` job on its address).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import threading
import time

import httpx


def queries(dashboard: dict) -> list[dict]:
    """``[{"title", "type", "targets": [(expr, legend)]}]`` of every panel with PromQL targets."""
    panels = []
    for panel in dashboard.get("panels", []):
        for inner in [panel, *panel.get("panels", [])]:
            targets = [(t["expr"], t.get("legendFormat") or t["expr"][:40]) for t in inner.get("targets", [])
                       if t.get("expr")]
            if targets:
                panels.append({"title": inner.get("title", "?"), "type": inner.get("type", ""), "targets": targets})
    return panels


def load(server: str, model: str, seconds: float, seed: int = 0) -> int:
    """Send a mixed load for ``seconds`` from two threads; the number of requests answered 200."""
    rng, stop, done = random.Random(seed), time.monotonic() + seconds, []
    shared = "def quicksort(items):\n    \"\"\"Sort a list.\"\"\"\n" * 3

    def worker(k: int) -> None:
        with httpx.Client(base_url=server, timeout=120) as http:
            while time.monotonic() < stop:
                n = rng.choice([4, 8, 16, 32, 64])
                if rng.random() < 0.5:
                    body = {"model": model, "prompt": (shared if rng.random() < 0.5 else "") + f"x{rng.random()}",
                            "max_tokens": n, "ignore_eos": rng.random() < 0.5, "stream": rng.random() < 0.3}
                    r = http.post("/v1/completions", json=body)
                else:
                    body = {"model": model, "messages": [{"role": "user", "content": shared + str(k)}],
                            "max_tokens": n}
                    r = http.post("/v1/chat/completions", json=body)
                done.append(r.status_code == 200)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(done)


def evaluate(prometheus: str, expr: str, start: float, end: float, step: float) -> list[tuple[str, list, list]]:
    r = httpx.get(f"{prometheus}/api/v1/query_range", params={"query": expr, "start": start, "end": end,
                                                               "step": step}, timeout=30)
    r.raise_for_status()
    out = []
    for series in r.json()["data"]["result"]:
        points = [(float(t), float(v)) for t, v in series["values"] if math.isfinite(float(v))]
        out.append((json.dumps(series["metric"]), [p[0] - start for p in points], [p[1] for p in points]))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dashboard", required=True)
    ap.add_argument("--prometheus", default="http://127.0.0.1:9090")
    ap.add_argument("--server", default="http://127.0.0.1:8000")
    ap.add_argument("--model", required=True, help="the served name ($model_name)")
    ap.add_argument("--load-seconds", type=float, default=0.0)
    ap.add_argument("--window", type=float, default=0.0, help="seconds of history drawn (default: the load's + 30)")
    ap.add_argument("--rate-interval", default="30s")
    ap.add_argument("--out", default="dashboard.png")
    args = ap.parse_args()
    panels = queries(json.loads(open(args.dashboard, encoding="utf-8").read()))
    begin = time.time()
    if args.load_seconds:
        print(f"load: {load(args.server, args.model, args.load_seconds)} requests answered in {args.load_seconds:g} s")
        time.sleep(15)  # two scrapes after the last request
    end = time.time()
    start = end - (args.window or (end - begin + 30))
    names = httpx.get(f"{args.prometheus}/api/v1/label/model_name/values",
                      params={"match[]": '{__name__=~"vllm:.*"}'}, timeout=30).json()["data"]
    print(f"$model_name choices (label_values of vllm:*): {names}")

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = 2
    rows = (len(panels) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(14, 3.2 * rows), squeeze=False)
    empty = []
    for ax, panel in zip(axes.flat, panels):
        filled = 0
        for expr, legend in panel["targets"]:
            expr = expr.replace("$model_name", args.model).replace("$__rate_interval", args.rate_interval)
            for labels, xs, ys in evaluate(args.prometheus, expr, start, end, 5):
                if xs:
                    filled += 1
                    label = labels if "{{" in legend or legend == "__auto" else legend
                    ax.plot(xs, ys, label=label[:40])
        ax.set_title(f"{panel['title']} ({filled} series)", fontsize=10)
        ax.set_xlabel("seconds", fontsize=8)
        if filled:
            ax.legend(fontsize=6, loc="upper left")
        else:
            empty.append(panel["title"])
        print(f"{panel['title']}: {filled} series with data")
    for ax in axes.flat[len(panels):]:
        ax.axis("off")
    fig.suptitle(f"the dashboard's queries, evaluated by Prometheus over paged's /metrics (model {args.model})", y=1.0)
    fig.tight_layout()
    fig.savefig(args.out, dpi=80)
    print(f"wrote {args.out}; empty panels: {empty or 'none'}")
    return 1 if empty else 0


if __name__ == "__main__":
    sys.exit(main())
