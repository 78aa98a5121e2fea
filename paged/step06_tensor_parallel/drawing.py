"""The step 06 layout as a picture, read from a real two-rank engine.

A tiny random LLaMA (4 query heads, 2 KV heads) runs under
``LLM(tensor_parallel_size=2)`` with ``B = 4``; one 6-token prompt is prefilled.
The picture shows the driver's one block table (logical block -> physical block,
``#filled``) and, under it, each rank's KV cache as fetched from that rank
(``engine.fetch_kv()``): for every block of the table, the keys of layer 0 it
holds, as a heat map of token slots x head dimensions. Both ranks use the same
block ids; the numbers differ, because each rank holds only its own KV head.
Unfilled slots are blank.

Draws on a bare ``Figure`` (no pyplot). Regenerate the docs picture with::

    python -m paged.step06_tensor_parallel.drawing docs/figures
"""

from __future__ import annotations

import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

PROMPT = [5, 9, 14, 3, 7, 11]
BLOCK_SIZE = 4


@dataclass
class Layout:
    """One sequence's block table and every rank's keys of layer 0 for those blocks."""

    blocks: list[int]  # physical block of each logical block
    filled: list[int]  # #filled of each logical block
    keys: list[torch.Tensor]  # per rank: [N, B, H_kv / W, D], layer 0's keys
    kv_shapes: list[tuple[int, ...]]  # per rank: the whole KV cache [L, 2, N, B, H_kv / W, D]


def read_layout(folder: str | Path) -> Layout:
    """Prefill ``PROMPT`` on two ranks and read the table and every rank's cache."""
    from paged.step06_tensor_parallel import LLM, SamplingParams

    llm = LLM(model=str(folder), tensor_parallel_size=2, dtype="float32", block_size=BLOCK_SIZE,
              num_blocks=16, swap_space=0, attention_backend="reference")
    try:
        engine = llm.engine
        engine.add_request("seq", PROMPT, SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))
        engine.step()  # the prefill: every rank writes the prompt's K/V for its own heads
        blocks = list(engine.scheduler.running[0].seqs[0].block_table.blocks)[: -(-len(PROMPT) // BLOCK_SIZE)]
        filled = [min(BLOCK_SIZE, len(PROMPT) - i * BLOCK_SIZE) for i in range(len(blocks))]
        caches = [kv for kv, _ in engine.fetch_kv()]
    finally:
        llm.close()
    return Layout(blocks, filled, [kv[0, 0].float() for kv in caches], [tuple(kv.shape) for kv in caches])


def figure(layout: Layout):
    """The block table on top, one row of heat maps per rank under it (a matplotlib ``Figure``)."""
    from matplotlib.figure import Figure

    ranks, n = len(layout.keys), len(layout.blocks)
    fig = Figure(figsize=(2.3 * n + 2.2, 0.8 + 1.9 * ranks))
    grid = fig.add_gridspec(ranks + 1, n, height_ratios=[0.3] + [1] * ranks, hspace=0.6, wspace=0.25)
    title = fig.add_subplot(grid[0, :])
    title.axis("off")
    entries = "    ".join(f"logical {i} → physical {b} (#filled {f})"
                           for i, (b, f) in enumerate(zip(layout.blocks, layout.filled)))
    title.text(0.0, 0.5, f"block table (one, in the driver):    {entries}", fontsize=9, va="center",
               fontweight="bold")
    scale = max(k[layout.blocks].abs().max().item() for k in layout.keys)
    for r, keys in enumerate(layout.keys):
        for i, (block, filled) in enumerate(zip(layout.blocks, layout.filled)):
            ax = fig.add_subplot(grid[r + 1, i])
            heat = keys[block, :, 0].clone()  # [B, D] of this rank's one KV head
            heat[filled:] = float("nan")  # unfilled slots: blank
            ax.imshow(heat.numpy(), cmap="coolwarm", vmin=-scale, vmax=scale, aspect="auto",
                      interpolation="nearest")
            first = i * BLOCK_SIZE
            ax.set_yticks(range(BLOCK_SIZE), [f"tok {first + s}" if s < filled else "—"
                                               for s in range(BLOCK_SIZE)], fontsize=6)
            ax.set_xticks([])
            ax.set_title(f"rank {r}: block {block}, KV head {r}", fontsize=8)
            if i == 0:
                shape = "[" + ", ".join(map(str, layout.kv_shapes[r])) + "]"
                ax.set_ylabel(f"rank {r}\nKVCache\n{shape}", fontsize=7, rotation=0, ha="right", va="center",
                              labelpad=28)
    return fig


def draw(layout: Layout, path: str | Path) -> None:
    """``figure(layout)`` as a PNG."""
    figure(layout).savefig(path, dpi=130, bbox_inches="tight")


def main(out_dir: str = "docs/figures") -> int:
    """Write ``step06_layout.png`` into ``out_dir`` (spawns one worker process)."""
    from paged.models.random_llama import random_llama

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        layout = read_layout(random_llama(Path(tmp) / "tiny"))  # 2 layers, 4 query / 2 KV heads
    draw(layout, out / "step06_layout.png")
    print(f"wrote {out / 'step06_layout.png'}: blocks {layout.blocks}, #filled {layout.filled}")
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
