"""The figures of ``python -m paged.bench preemption``: Figure 19's two panels and the queue timeline."""

from __future__ import annotations


def plot_timeline(runs: dict, path: str, title: str) -> None:
    """Queues (waiting / running / swapped) and blocks in use (device, host) per iteration, per mode."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(4.2 * len(runs), 4.6))  # no pyplot: the caller's backend is left alone
    axes = fig.subplots(2, len(runs), sharex="col", squeeze=False)
    for col, (mode, rows) in enumerate(runs.items()):
        x = range(1, len(rows) + 1)
        q, b = axes[0][col], axes[1][col]
        for key, color in (("waiting", "#8c8c8c"), ("running", "#4c72b0"), ("swapped", "#dd8452")):
            q.step(x, [r[key] for r in rows], where="post", color=color, label=key)
        done = rows[-1]["preemptions"]
        q.set_title(f"{mode}: {done['swap']} swap-outs, {done['recompute']} recomputes", fontsize=9)
        q.set_ylabel("requests")
        q.legend(fontsize=7, frameon=False, loc="upper right")
        b.fill_between(x, [r["blocks_used"] for r in rows], step="post", color="#4c72b0", alpha=0.6,
                       label="device blocks used")
        b.step(x, [r["swap_blocks_used"] for r in rows], where="post", color="#dd8452", label="host blocks used")
        b.axhline(rows[0]["blocks_total"], color="black", lw=0.8, ls="--", label="device pool")
        b.set_xlabel("iteration")
        b.set_ylabel("blocks")
        b.legend(fontsize=7, frameon=False, loc="upper right")
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def plot_figure19(result: dict, path: str, title: str) -> None:
    """(a) swap out / in / both and recompute per block size; (b) normalized latency per mode."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(9.6, 3.6))
    a, b = fig.subplots(1, 2, gridspec_kw={"width_ratios": [3, 2]})
    rows = result["micro"]
    xs = [r["block_size"] for r in rows]
    a.plot(xs, [r["recompute_ms"] for r in rows], "o-", color="#55a868", label="recompute")
    a.plot(xs, [r["swap_out_ms"] for r in rows], "v--", color="#dd8452", lw=0.8, label="swap out")
    a.plot(xs, [r["swap_in_ms"] for r in rows], "^--", color="#c44e52", lw=0.8, label="swap in")
    a.plot(xs, [r["swap_ms"] for r in rows], "s-", color="#8172b2", label="swap out + in")
    a.set_xscale("log", base=2)
    a.set_yscale("log")
    a.set_xticks(xs)
    a.set_xticklabels([str(x) for x in xs])
    a.set_xlabel("block size")
    a.set_ylabel("latency (ms)")
    a.set_title("(a) swap vs recompute, one group", fontsize=9)
    a.legend(fontsize=7, frameon=False)
    e2e = result["e2e"]
    modes = list(e2e)
    values = [e2e[m]["normalized_latency_s"] for m in modes]
    bars = b.bar(modes, values, color=["#8172b2", "#55a868", "#4c72b0"][: len(modes)])
    for bar, m in zip(bars, modes):
        p = e2e[m]["preemptions"]
        b.text(bar.get_x() + bar.get_width() / 2, bar.get_height(),
               f"{e2e[m]['throughput_tok_s']:.0f} tok/s\n{p['swap']} sw / {p['recompute']} rc",
               ha="center", va="bottom", fontsize=7)
    b.set_ylim(0, max(values) * 1.3)
    b.set_ylabel("normalized latency (s/token)")
    b.set_title("(b) starved ShareGPT-like workload", fontsize=9)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
