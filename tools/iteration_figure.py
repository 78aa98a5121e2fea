"""Three consecutive iterations of a real step 03 engine run, drawn: iteration-level batching.

    python tools/iteration_figure.py docs/figures      # what `make iteration-figure` runs

The run is ``record_runs.run_step03``: the demo model, 12 blocks of 4 tokens, requests A,
B and C from the start and D arriving before iteration 3, while ``max_num_seqs=3`` keeps
it waiting. The figure shows the three iterations around the moment the batch changes
— A finishes in the first, D is admitted in the second, two tables grow in the third —
one row each:

* per running request, the tokens it feeds in this iteration (a whole prompt when it is
  admitted, one token when it decodes), decoded, and the token it samples;
* its block table, the blocks taken this iteration outlined in green;
* under them, the iteration's events and the pool of 12 blocks, coloured by owner.

It writes ``step03_iterations.png`` and ``step03_iterations.txt`` (the same, as text;
``tests/test_docs_tools.py`` checks that the committed text is what the run draws today).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from record_runs import demo_model, run_step03  # noqa: E402

FIRST = 5  # the first iteration drawn: the one in which A finishes
COLORS = {"A": "#4c72b0", "B": "#dd8452", "C": "#55a868", "D": "#c44e52"}


def _rows(frame: dict, before: dict) -> list[dict]:
    """Per sequence the plan ran: request, new tokens, sampled token, table, new blocks, finished?"""
    owner = {s["seq_id"]: r["id"] for r in before["snapshot"]["requests"] + frame["snapshot"]["requests"]
             for s in r["seqs"]}
    finished = {e["seq"]: e["detail"]["reason"] for e in frame["events"] if e["kind"] == "finished"}
    new = {}
    for e in frame["events"]:
        if e["kind"] == "allocated":
            new.setdefault(e["seq"], []).extend(e["detail"]["blocks"])
    rows = []
    for seq in frame["plan"]["seqs"]:
        sid = seq["seq_id"]
        rows.append({"request": owner.get(sid, "?"), "tokens": seq["tokens"], "positions": seq["positions"],
                     "sampled": frame["sampled"].get(sid, ""), "table": seq["block_table"],
                     "new": new.get(sid, []), "finished": finished.get(sid), "context": seq["context_len"]})
    return rows


def _label(token: str) -> str:
    """A token as drawn: a space as ␣ (tokens carry their leading space), the empty start token as ‹s›."""
    return token.replace(" ", "␣").replace("\n", "⏎") if token else "‹s›"


def render_text(run: dict, first: int = FIRST) -> str:
    """The three iterations as text: per request its tokens in, its sample, its table."""
    frames = run["frames"]
    lines = [f"Three iterations of a step 03 engine (B = {run['block_size']}, "
             f"{len(frames[0]['refs']['device'])} blocks, greedy, the demo model)", ""]
    for it in range(first, first + 3):
        frame, before = frames[it], frames[it - 1]
        lines.append(f"iteration {it}")
        for row in _rows(frame, before):
            kind = "prompt" if len(row["tokens"]) > 1 else "decode"
            toks = " ".join(_label(t) for t in row["tokens"])
            new = f"  new block {', '.join(map(str, row['new']))}" if row["new"] else ""
            end = f"  -> finished ({row['finished']})" if row["finished"] else ""
            lines.append(f"  {row['request']}  {kind:<6} in: {toks:<34} out: {_label(row['sampled']):<10} "
                         f"table {row['table']}{new}{end}")
        admitted = [e["request"] for e in frame["events"] if e["kind"] == "admitted"]
        if admitted:
            lines.append(f"  admitted: {', '.join(admitted)}")
        waiting = [frame["snapshot"]["requests"][i]["id"] for i in frame["snapshot"]["queues"]["waiting"]]
        refs = frame["refs"]["device"]
        lines.append(f"  after it: waiting {waiting or '[]'}, {sum(1 for r in refs if r)} of {len(refs)} blocks used")
        lines.append("")
    return "\n".join(lines)


def plot(run: dict, path: str | Path, first: int = FIRST) -> None:
    """The three iterations side by side as a PNG (a bare matplotlib ``Figure``: no pyplot)."""
    from matplotlib.figure import Figure
    from matplotlib.patches import Rectangle

    frames, b = run["frames"], run["block_size"]
    fig = Figure(figsize=(12.5, 9.6))
    axes = fig.subplots(3, 1)
    fig.subplots_adjust(left=0.01, right=0.99, top=0.94, bottom=0.01, hspace=0.08)
    for ax, it in zip(axes, range(first, first + 3)):
        frame, before = frames[it], frames[it - 1]
        rows = _rows(frame, before)
        ax.set_xlim(0, 21.0)
        ax.set_ylim(-0.2, 4.8)
        ax.axis("off")
        ax.text(0.0, 4.55, f"iteration {it}", fontsize=12.5, fontweight="bold", va="center")
        ax.text(0.0, 4.0, "request · tokens in → token out", fontsize=8.5, color="#555")
        ax.text(7.6, 4.0, "block table (green: new)", fontsize=8.5, color="#555")
        ax.text(13.0, 4.0, "what happened", fontsize=8.5, color="#555")
        for r, row in enumerate(rows):
            y = 3.05 - r * 1.12
            color = COLORS.get(row["request"], "#888")
            ax.text(0.0, y + 0.3, row["request"], fontsize=12, fontweight="bold", color=color, va="center")
            tokens = row["tokens"]
            shown = tokens if len(tokens) <= 4 else tokens[:1] + ["…"] + tokens[-2:]
            x = 0.5
            for t in shown:
                w = max(0.95, 0.14 * len(_label(t)[:7]) + 0.2)
                ax.add_patch(Rectangle((x, y), w, 0.6, facecolor=color, alpha=0.25, edgecolor=color))
                ax.text(x + w / 2, y + 0.3, _label(t)[:7], fontsize=7, ha="center", va="center")
                x += w + 0.05
            kind = f"prompt, {len(tokens)} tokens" if len(tokens) > 1 else f"decode, position {row['positions'][0]}"
            ax.text(0.5, y - 0.18, kind, fontsize=6.5, color="#555")
            ax.annotate("", xy=(x + 0.45, y + 0.3), xytext=(x + 0.05, y + 0.3),
                        arrowprops=dict(arrowstyle="->", color="#333"))
            ax.text(x + 0.5, y + 0.3, _label(row["sampled"])[:8], fontsize=7.5, va="center", fontweight="bold")
            for j, block in enumerate(row["table"]):
                bx = 7.6 + j * 0.8
                filled = min(b, row["context"] - j * b)
                new = block in row["new"]
                ax.add_patch(Rectangle((bx, y), 0.7, 0.6, facecolor=color, alpha=0.15 + 0.5 * filled / b,
                                       edgecolor="#2ca02c" if new else "black", lw=2.2 if new else 0.6))
                ax.text(bx + 0.35, y + 0.3, str(block), fontsize=8, ha="center", va="center")
            if row["finished"]:
                ax.text(7.6 + len(row["table"]) * 0.8 + 0.05, y + 0.3, f"finished\n({row['finished']})",
                        fontsize=7, color="#c00", va="center")
        notes = []
        for e in frame["events"]:
            if e["kind"] == "admitted":
                notes.append(f"{e['request']} admitted: its whole prompt runs in this iteration")
            elif e["kind"] == "finished":
                notes.append(f"{e['request']} finished: its blocks go back to the free list")
            elif e["kind"] == "allocated" and not any(a["kind"] == "admitted" and a["request"] == e["request"]
                                                      for a in frame["events"]):
                notes.append(f"{e['request']}: its last block was full, so block "
                             f"{', '.join(map(str, e['detail']['blocks']))} is taken")
        waiting = [frame["snapshot"]["requests"][i]["id"] for i in frame["snapshot"]["queues"]["waiting"]]
        if waiting:
            notes.append(f"waiting: {', '.join(waiting)} (max_num_seqs = 3)")
        for k, note in enumerate(notes):
            ax.text(13.0, 3.35 - 0.45 * k, note, fontsize=9, color="#333")
        owner = frame["snapshot"]["pools"]["device"]["owner"]
        reqs = frame["snapshot"]["requests"]
        ax.text(13.0, 1.05, "the pool after it:", fontsize=8.5, color="#555", va="center")
        for block, who in enumerate(owner):
            name = reqs[who]["id"] if who >= 0 else None
            ax.add_patch(Rectangle((13.0 + block * 0.66, 0.1), 0.6, 0.55,
                                   facecolor=COLORS.get(name, "#888") if name else "#eeeeee",
                                   alpha=0.55 if name else 1.0, edgecolor="#999", lw=0.5))
            ax.text(13.0 + block * 0.66 + 0.3, 0.375, str(block), fontsize=7.5, ha="center", va="center")
    fig.suptitle("Iteration-level batching, from a real run: the batch is re-formed after every forward pass",
                 fontsize=12, x=0.01, ha="left")
    fig.savefig(path, dpi=120, bbox_inches="tight")


def main(out_dir: str = "docs/figures") -> int:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    run = run_step03(demo_model())
    (out / "step03_iterations.txt").write_text(render_text(run))
    plot(run, out / "step03_iterations.png")
    print(f"wrote {out / 'step03_iterations'}.txt and .png")
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
