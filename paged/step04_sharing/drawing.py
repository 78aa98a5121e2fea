"""Figures 8, 9 and 10 as pictures: the snapshots of ``diagram`` drawn with matplotlib.

Each snapshot (real block tables and reference counts, read by
``paged.step04_sharing.diagram``) becomes one panel:

* left, one row per sequence: its block table, one box per logical block naming
  the physical block it maps;
* right, one row per used physical block: the tokens it holds and its reference
  count; a block mapped by more than one table is drawn grey, it is shared; a
  free block the figure is about (a copy whose candidate was dropped, a prefix
  block still in the cache) is hatched, with why it is drawn;
* an arrow per table entry, from the logical block to the physical one;
* under them, the free list, the copy-on-writes of the iteration and the note.

Draws on a bare ``Figure`` (no pyplot), so it never changes the caller's
matplotlib backend. Regenerate the docs pictures with::

    python -m paged.step04_sharing.drawing docs/figures
"""

from __future__ import annotations

import sys
from pathlib import Path

from paged.step04_sharing.diagram import Snapshot, figure8, figure9_demo, figure10

COLORS = ["#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3", "#937860", "#da8bc3", "#8c8c8c"]
SHARED = "#bbbbbb"
CELL_W, ROW_H = 1.0, 1.0  # one token cell, one row (axis units)


def _rows(snap: Snapshot) -> int:
    """Rows of boxes in a panel: one per table or per drawn block (used, or kept in ``unmapped``)."""
    return max(len(snap.tables), len(snap.ref_counts) + len(snap.unmapped))


def _footer(snap: Snapshot) -> list[str]:
    """The lines under a panel: free list, cached blocks, copies, note."""
    free = snap.free if len(snap.free) <= 12 else f"{len(snap.free)} blocks"
    lines = [f"free blocks: {free}"]
    if snap.cached_free:
        lines.append(f"free but cached (evicted least recently used first): {snap.cached_free}")
    if snap.copies:
        lines.append("copy-on-write this iteration (src → dst): " + ", ".join(f"{s} → {d}" for s, d in snap.copies))
    if snap.note:
        lines += snap.note.splitlines()
    return lines


def draw_panel(ax, snap: Snapshot) -> None:
    """One snapshot: tables left, physical blocks right, arrows between, footer below."""
    b, rows = snap.block_size, _rows(snap)
    widest_table = max((len(blocks) for _, blocks, _, _ in snap.tables), default=1)
    x_phys = 3.2 + widest_table * 1.3 + 2.4  # left edge of the physical blocks' token cells
    top = rows * ROW_H
    used = sorted(snap.ref_counts)
    drawn = used + sorted(b for b in snap.unmapped if b not in snap.ref_counts)  # used blocks, then the free ones
    y_of_block = {block: top - (i + 1) * ROW_H for i, block in enumerate(drawn)}
    words_of: dict[int, list[str]] = {}
    for r, (name, blocks, n, words) in enumerate(snap.tables):
        y, color = top - (r + 1) * ROW_H, COLORS[r % len(COLORS)]
        ax.text(3.0, y + 0.4, name, ha="right", va="center", fontsize=8, color=color, fontweight="bold")
        for i, block in enumerate(blocks):
            x = 3.2 + i * 1.3
            ax.add_patch(_box(x, y, 1.1, _light(color)))  # opaque: arrows pass under it
            ax.text(x + 0.55, y + 0.4, str(block), ha="center", va="center", fontsize=8, zorder=3)
            filled = min(b, n - i * b)
            words_of.setdefault(block, words[i * b: i * b + filled])
            if block in y_of_block:
                ax.annotate("", xy=(x_phys - 0.75, y_of_block[block] + 0.4), xytext=(x + 1.1, y + 0.4),
                            arrowprops=dict(arrowstyle="->", color=color, lw=0.9), zorder=1)
    if snap.tables:
        ax.text(3.2, top + 0.35, "block tables", fontsize=8, color="#444")
    if drawn:
        ax.text(x_phys, top + 0.35, "physical blocks (grey: shared)", fontsize=8, color="#444")
        ax.text(x_phys + b * CELL_W + 0.2, top + 0.35, "ref", fontsize=8, color="#444")
    for block in drawn:
        y, count = y_of_block[block], snap.ref_counts.get(block, 0)
        shared, free = count > 1, block not in snap.ref_counts
        ax.text(x_phys - 0.2, y + 0.4, f"{block}", ha="right", va="center", fontsize=8, fontweight="bold")
        cells = words_of.get(block, snap.unmapped.get(block, []))
        for j in range(b):
            word = cells[j] if j < len(cells) else ""
            box = _box(x_phys + j * CELL_W, y, CELL_W, SHARED if shared and word else "white")
            if free:
                box.set_hatch("//")
                box.set_edgecolor("#c8c8c8")
            ax.add_patch(box)
            ax.text(x_phys + (j + 0.5) * CELL_W, y + 0.4, word, ha="center", va="center", fontsize=6.5,
                    color="#777" if free else "black")
        ax.text(x_phys + b * CELL_W + 0.4, y + 0.4, str(count), ha="center", va="center",
                fontsize=8, fontweight="bold" if shared else "normal")
        if free:
            why = ("free, still findable in the prefix cache" if block in snap.cached_free
                   else "free again: its candidate was dropped")
            ax.text(x_phys + b * CELL_W + 1.5, y + 0.4, why, va="center", fontsize=7, color="#777")
    for src, dst in snap.copies:  # copy-on-write: dashed arrow from the copied block to its copy
        if src in y_of_block and dst in y_of_block:
            x_right = x_phys + b * CELL_W + 0.9
            ax.annotate("", xy=(x_right, y_of_block[dst] + 0.4), xytext=(x_right, y_of_block[src] + 0.4),
                        arrowprops=dict(arrowstyle="->", linestyle="--", color="#c44e52",
                                        connectionstyle="arc3,rad=-0.4"))
    for k, line in enumerate(_footer(snap)):
        ax.text(0.0, -0.5 - 0.6 * k, line, fontsize=7.5, va="center", color="#333")
    ax.set_title(snap.title, fontsize=9.5, loc="left")
    ax.set_xlim(-0.2, x_phys + b * CELL_W + (7.5 if snap.unmapped else 2.2))
    ax.set_ylim(-0.5 - 0.6 * len(_footer(snap)), top + 0.8)
    ax.axis("off")


def _box(x, y, width, color):
    from matplotlib.patches import Rectangle

    return Rectangle((x, y), width, 0.8, facecolor=color, edgecolor="black", lw=0.6, zorder=2)


def _light(color: str, strength: float = 0.35) -> tuple[float, float, float]:
    """``color`` mixed with white, as an opaque color."""
    from matplotlib.colors import to_rgb

    return tuple(1 - strength * (1 - c) for c in to_rgb(color))


def draw(snaps: list[Snapshot], path: str | Path) -> None:
    """All snapshots of one figure, one panel each, top to bottom, as a PNG."""
    from matplotlib.figure import Figure

    heights = [_rows(s) + 1.5 + 0.6 * len(_footer(s)) for s in snaps]
    width = max(max((len(bl) for _, bl, _, _ in s.tables), default=1) * 1.3 + s.block_size * 1.25
                + (5.3 if s.unmapped else 0) for s in snaps)
    fig = Figure(figsize=(max(7.0, 0.62 * (width + 8.0)), 0.36 * sum(heights) + 0.3))
    axes = fig.subplots(len(snaps), 1, squeeze=False, gridspec_kw={"height_ratios": heights})[:, 0]
    for ax, snap in zip(axes, snaps):
        draw_panel(ax, snap)
    fig.savefig(path, dpi=130, bbox_inches="tight")


def main(out_dir: str = "docs/figures") -> int:
    """Write ``step04_figure8/9/10.png`` into ``out_dir`` (Figure 9 runs the demo model)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for name, snaps in [("figure8", figure8()), ("figure9", figure9_demo()), ("figure10", figure10())]:
        draw(snaps, out / f"step04_{name}.png")
        print(f"wrote {out / f'step04_{name}.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
