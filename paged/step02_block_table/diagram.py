"""Block-table diagrams drawn from real ``BlockTable`` objects (paper Figures 6 and 7).

The paper explains the mapping with two pictures: Figure 6, one request whose
7-token prompt and 2 generated tokens live in physical blocks 7, 1 and 3
(``B = 4``); Figure 7, two requests interleaved in the same pool. Here those
pictures are not drawn by hand: ``figure6()`` (at each of its three stages)
and ``figure7()`` run the
paper's scenario through ``Sequence`` / ``BlockTable`` / ``BlockAllocator``
(the allocator's free list is set so it hands out the paper's block numbers),
and ``render_text`` / ``plot`` draw whatever state the tables are in.

Regenerate the docs figures with::

    python -m paged.step02_block_table.diagram docs/figures

Extends: nothing; it reads ``BlockTable.blocks``, ``filled`` and ``num_tokens``.
"""

from __future__ import annotations

import sys
from pathlib import Path

from paged.step01_allocator import BlockAllocator
from paged.step02_block_table.block_table import BlockTable
from paged.step02_block_table.sequence import Sequence

# A request as the diagrams see it: its name, its table, the word of each token.
Request = tuple[str, BlockTable, list[str]]


def _block_words(table: BlockTable, words: list[str], logical: int) -> list[str]:
    b = table.block_size
    return words[logical * b : logical * b + table.filled(logical)]


# --8<-- [start:render_text]
def render_text(requests: list[Request], num_blocks: int) -> str:
    """Each request's block table, then the physical pool, as plain text.

    Args:
        requests: ``(name, table, words)``; ``words[p]`` labels token ``p``.
        num_blocks: ``N``, rows of the physical pool to draw.
    """
    lines, owner = [], {}
    for name, table, words in requests:
        lines.append(f"{name} · block table (B = {table.block_size}, {table.num_tokens} tokens)")
        lines.append("  logical │ physical │ #filled │ tokens")
        for i, block in enumerate(table.blocks):
            content = " ".join(_block_words(table, words, i))
            lines.append(f"  {i:>7} │ {block:>8} │ {table.filled(i):>7} │ {content}")
            owner[block] = (name, table, words, i)
        lines.append(f"  {table.num_blocks:>7} │ {'–':>8} │ {'–':>7} │")
        lines.append("")
    lines.append("physical KV blocks")
    width = max((len(w) for _, _, words in requests for w in words), default=1)
    for block in range(num_blocks):
        if block in owner:
            name, table, words, i = owner[block]
            cells = _block_words(table, words, i)
            cells += ["·"] * (table.block_size - len(cells))
            row = " │ ".join(f"{c:<{width}}" for c in cells)
            lines.append(f"  block {block:>2} │ {row} │  {name}, logical {i}")
        else:
            lines.append(f"  block {block:>2} │ free")
    return "\n".join(lines) + "\n"


# --8<-- [end:render_text]


def _size(requests: list[Request], num_blocks: int) -> tuple[float, float]:
    """The (width, height) in inches of one panel."""
    b = requests[0][1].block_size
    rows_left = sum(t.num_blocks + 1 for _, t, _ in requests) + len(requests)
    return 2 * b * 0.95 + 4.6, max(rows_left, num_blocks) * 0.42 + 0.9


def plot(requests: list[Request], num_blocks: int, path: str | Path, title: str = "") -> None:
    """Draw logical blocks → physical blocks as a PNG (matplotlib, imported here only; no pyplot,
    so the caller's backend is left alone)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=_size(requests, num_blocks))
    _draw(fig.subplots(), requests, num_blocks, title)
    fig.savefig(path, dpi=150, bbox_inches="tight")


def plot_stages(stages: list[tuple[str, list[Request]]], num_blocks: int, path: str | Path, title: str = "") -> None:
    """Several states of the same tables, one panel each, top to bottom (Figure 6's three stages)."""
    from matplotlib.figure import Figure

    widths, heights = zip(*(_size(requests, num_blocks) for _, requests in stages))
    fig = Figure(figsize=(max(widths), sum(heights) * 0.82 + 0.4))
    axes = fig.subplots(len(stages), 1)
    fig.subplots_adjust(top=0.95, bottom=0.0, hspace=0.12)
    for ax, (caption, requests) in zip(axes, stages):
        _draw(ax, requests, num_blocks, caption)
    if title:
        fig.suptitle(title, fontsize=11, x=0.01, ha="left")
    fig.savefig(path, dpi=150, bbox_inches="tight")


def _draw(ax, requests: list[Request], num_blocks: int, title: str) -> None:
    """One panel: each request's logical blocks, the physical pool, an arrow per table entry."""
    from matplotlib.patches import Rectangle

    b = requests[0][1].block_size
    colors = ["#4c72b0", "#dd8452", "#55a868", "#c44e52"]
    rows_left = sum(t.num_blocks + 1 for _, t, _ in requests) + len(requests)
    cell, x_phys = 0.95, b * 0.95 + 2.2

    def row(x, y, words, color, label):
        for j in range(b):
            word = words[j] if j < len(words) else ""
            ax.add_patch(Rectangle((x + j * cell, y), cell, 0.8, facecolor=color if word else "white",
                                   alpha=0.35 if word else 1.0, edgecolor="black", lw=0.8))
            ax.text(x + (j + 0.5) * cell, y + 0.4, word, ha="center", va="center", fontsize=7)
        ax.text(x - 0.1, y + 0.4, label, ha="right", va="center", fontsize=7)

    y, where = max(rows_left, num_blocks) - 1, {}
    for r, (name, table, words) in enumerate(requests):
        ax.text(0, y + 0.4, name, fontsize=9, fontweight="bold", va="center")
        y -= 1
        for i in range(table.num_blocks):
            row(0, y, _block_words(table, words, i), colors[r % 4], f"logical {i}")
            where[table.blocks[i]] = (y, r, table, words, i)
            y -= 1
        y -= 1
    for block in range(num_blocks):
        yp = num_blocks - 1 - block
        if block in where:
            yl, r, table, words, i = where[block]
            row(x_phys, yp, _block_words(table, words, i), colors[r % 4], f"block {block}")
            ax.annotate("", xy=(x_phys - 1.0, yp + 0.4), xytext=(b * cell + 0.05, yl + 0.4),
                        arrowprops=dict(arrowstyle="->", color=colors[r % 4], lw=1.0))
            ax.text(x_phys + b * cell + 0.15, yp + 0.4, f"#filled {table.filled(i)}",
                    ha="left", va="center", fontsize=7, color=colors[r % 4])
        else:
            row(x_phys, yp, [], "white", f"block {block}")
    ax.text(x_phys + b * cell / 2, max(rows_left, num_blocks) + 0.1, "physical KV blocks",
            ha="center", fontsize=9, fontweight="bold")
    ax.set_xlim(-1.6, x_phys + b * cell + 1.6)
    ax.set_ylim(-0.3, max(rows_left, num_blocks) + 0.7)
    ax.axis("off")
    if title:
        ax.set_title(title, fontsize=10)


# --8<-- [start:figures]
FIG6_PROMPT = "Four score and seven years ago our".split()
FIG7_PROMPT_B = "It was the best of times".split()


def _vocab(words: list[str]) -> tuple[list[int], list[str]]:
    """Token ids for ``words`` (a toy tokenizer: one id per distinct word)."""
    table = {w: i for i, w in enumerate(dict.fromkeys(words))}
    return [table[w] for w in words], list(table)


def _step(seq: Sequence, token_id: int) -> None:
    """One decode step: the sampled token gets its KV slot (no model here)."""
    seq.append_token(token_id)
    seq.block_table.append(1)


def figure6(stage: int = 3) -> tuple[BlockAllocator, list[Request]]:
    """Figure 6: a 7-token prompt, then "fathers" and "brought"; B = 4, 8 blocks.

    ``stage`` 1 stops after the prompt's prefill, 2 after "fathers", 3 (the default) after "brought":
    the paper's three stages.
    """
    ids, vocab = _vocab(FIG6_PROMPT + ["fathers", "brought"])
    allocator = BlockAllocator(8, free_order=[7, 1, 3, 0, 2, 4, 5, 6])
    seq = Sequence(0, ids[:7], BlockTable(allocator, 4))
    seq.block_table.append(7)  # prompt: ceil(7 / 4) = 2 blocks (7, 1)
    if stage >= 2:
        _step(seq, ids[7])  # "fathers" fills logical block 1
    if stage >= 3:
        _step(seq, ids[8])  # "brought" needs logical block 2 (physical 3)
    return allocator, [("Request A", seq.block_table, [vocab[t] for t in seq.token_ids])]


FIG6_STAGES = ("① prefill: the 7-token prompt takes 2 blocks",
               "② decode: “fathers” fills block 1's last slot",
               "③ decode: “brought” needs a new block, 3")


def figure7() -> tuple[BlockAllocator, list[Request]]:
    """Figure 7: request A as in Figure 6 and request B interleaved in the same pool."""
    ids, vocab = _vocab(FIG6_PROMPT + ["fathers", "brought"] + FIG7_PROMPT_B)
    allocator = BlockAllocator(8, free_order=[7, 1, 5, 2, 3, 0, 4, 6])
    a = Sequence(0, ids[:7], BlockTable(allocator, 4))
    b = Sequence(1, ids[9:], BlockTable(allocator, 4))
    a.block_table.append(7)  # A's prompt: blocks 7, 1
    b.block_table.append(6)  # B's prompt: blocks 5, 2
    _step(a, ids[7])  # A: "fathers" (block 1 is now full)
    _step(a, ids[8])  # A: "brought" -> block 3
    return allocator, [
        (name, seq.block_table, [vocab[t] for t in seq.token_ids])
        for name, seq in [("Request A", a), ("Request B", b)]
    ]


# --8<-- [end:figures]


def main(out_dir: str = "docs/figures") -> int:
    """Write ``step02_figure6`` / ``step02_figure7`` as ``.txt`` and ``.png`` into ``out_dir``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    stages = [(caption, figure6(k + 1)) for k, caption in enumerate(FIG6_STAGES)]
    (out / "step02_figure6.txt").write_text("\n".join(f"{caption}\n{render_text(requests, allocator.num_blocks)}"
                                                      for caption, (allocator, requests) in stages))
    plot_stages([(caption, requests) for caption, (_, requests) in stages], 8, out / "step02_figure6.png",
                "Figure 6 · block table translation, in three stages (B = 4)")
    allocator, requests = figure7()
    (out / "step02_figure7.txt").write_text(render_text(requests, allocator.num_blocks))
    plot(requests, allocator.num_blocks, out / "step02_figure7.png", "Figure 7 · two requests in one pool (B = 4)")
    print(f"wrote {out}/step02_figure6 and step02_figure7 (.txt and .png)")
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
