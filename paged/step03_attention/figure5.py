"""The paper's Figure 5 drawn from real state: one query walking its block table, block by block.

Figure 5 of the paper shows the query of the word *forth* reading the key and value
blocks of its sequence where they sit in memory, one block at a time. ``figure5()``
runs that on the real objects: a ``BlockTable`` over a ``BlockAllocator`` whose free
list is shuffled, a ``KVCache`` the sequence's keys and values are written into
through the slot mapping, and the block-wise attention's own update
(``online_softmax_update``) folding in one block per step. Each ``Step`` records what
that block contributed and the running maximum and sum after it; the end result is
compared with contiguous attention (SDPA) over the same keys and values.

Regenerate the docs figure (text and picture) with::

    python -m paged.step03_attention.figure5 docs/figures

Extends: nothing; it reads ``BlockTable.blocks`` and calls ``online_softmax_update``.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from paged.step01_allocator import BlockAllocator
from paged.step02_block_table import BlockTable, KVCache
from paged.step03_attention.blockwise import online_softmax_update


@dataclass
class Step:
    """One block of the walk: where it is, what it held, and the online softmax after it."""

    logical: int
    physical: int
    positions: list[int]  # the key positions the block holds
    scores: list[float]  # q · k * scale of each of them
    running_max: float  # m after this block
    running_sum: float  # l after this block (sum of exp(score - m))


@dataclass
class Walk:
    block_size: int
    num_blocks: int  # of the pool
    table: list[int]  # the block table
    steps: list[Step]
    weights: list[float]  # the final attention weight of each position
    max_diff: float  # largest |blockwise - SDPA| over the output


# --8<-- [start:walk]
def figure5(num_tokens: int = 10, block_size: int = 4, num_blocks: int = 8, head_dim: int = 8,
            seed: int = 7) -> Walk:
    """The last token's query attends over ``num_tokens`` keys stored in a shuffled pool."""
    gen = torch.Generator().manual_seed(seed)
    order = torch.randperm(num_blocks, generator=gen).tolist()  # the pool's free list, shuffled
    table = BlockTable(BlockAllocator(num_blocks, free_order=order), block_size)
    cache = KVCache(1, num_blocks, block_size, 1, head_dim, dtype=torch.float64)
    k = torch.randn(num_tokens, 1, head_dim, generator=gen, dtype=torch.float64)  # [T, H_kv, D]
    v = torch.randn(num_tokens, 1, head_dim, generator=gen, dtype=torch.float64)
    cache.write(0, k, v, torch.tensor(table.append(num_tokens)))  # through the slot mapping
    q = torch.randn(1, 1, 1, head_dim, generator=gen, dtype=torch.float64)  # [T_q, H_kv, G, D]
    scale = head_dim ** -0.5
    m = torch.full((1, 1, 1), float("-inf"), dtype=torch.float64)
    l = torch.zeros((1, 1, 1), dtype=torch.float64)
    acc = torch.zeros((1, 1, 1, head_dim), dtype=torch.float64)
    steps = []
    for j, phys in enumerate(table.blocks):  # logical block j lives in physical block phys
        n = table.filled(j)
        kj, vj = cache.key(0)[phys, :n], cache.value(0)[phys, :n]  # read where it sits: [n, H_kv, D]
        s = torch.einsum("qhgd,nhd->qhgn", q, kj) * scale
        m, l, acc = online_softmax_update(m, l, acc, s, vj)
        steps.append(Step(j, phys, list(range(j * block_size, j * block_size + n)),
                          s.flatten().tolist(), m.item(), l.item()))
    out = (acc / l[..., None]).flatten()
    scores = torch.cat([torch.tensor(st.scores, dtype=torch.float64) for st in steps])
    weights = torch.exp(scores - m.item()) / l.item()
    expected = torch.nn.functional.scaled_dot_product_attention(
        q.reshape(1, 1, 1, head_dim), k.reshape(1, 1, num_tokens, head_dim),
        v.reshape(1, 1, num_tokens, head_dim)).flatten()
    return Walk(block_size, num_blocks, list(table.blocks), steps, weights.tolist(),
                (out - expected).abs().max().item())
# --8<-- [end:walk]


def render_text(walk: Walk) -> str:
    """The walk as a table: one row per block, in the sequence's order."""
    b, c = walk.block_size, sum(len(s.positions) for s in walk.steps)
    lines = [f"Figure 5 · the query of position {c - 1} walks its block table "
             f"(B = {b}, {c} tokens, a pool of {walk.num_blocks} blocks handed out shuffled)", "",
             "block table: " + ", ".join(f"logical {i} → physical {p}" for i, p in enumerate(walk.table)), "",
             "step │ logical │ physical │ #filled │ keys     │ max score │ running max m │ running sum l",
             "─────┼─────────┼──────────┼─────────┼──────────┼───────────┼───────────────┼──────────────"]
    for i, s in enumerate(walk.steps, 1):
        keys = f"k{s.positions[0]}..k{s.positions[-1]}" if len(s.positions) > 1 else f"k{s.positions[0]}"
        lines.append(f"{i:>4} │ {s.logical:>7} │ {s.physical:>8} │ {len(s.positions):>7} │ {keys:<8} │ "
                     f"{max(s.scores):>9.4f} │ {s.running_max:>13.4f} │ {s.running_sum:>13.4f}")
    lines += ["", "attention weight of each key: " + "  ".join(f"k{p}={w:.3f}" for p, w in enumerate(walk.weights)),
              f"output = acc / l; largest difference from SDPA over k0..k{c - 1}: "
              f"{'below 1e-12' if walk.max_diff < 1e-12 else f'{walk.max_diff:.1e}'}"]
    return "\n".join(lines) + "\n"


def plot(walk: Walk, path) -> None:
    """Top: the pool, each block the walk reads numbered in reading order. Bottom: the weights."""
    from matplotlib.figure import Figure
    from matplotlib.patches import Rectangle

    fig = Figure(figsize=(10, 5.2), layout="constrained")
    pool, bars = fig.subplots(2, 1, height_ratios=[1, 1.3])
    colors = ["#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3", "#937860"]
    b = walk.block_size
    for phys in range(walk.num_blocks):
        step = next((i for i, s in enumerate(walk.steps) if s.physical == phys), None)
        for o in range(b):
            filled = step is not None and o < len(walk.steps[step].positions)
            pool.add_patch(Rectangle(
                (phys * (b + 1) + o, 0), 0.95, 1, color=colors[step % len(colors)] if filled else "#e5e5e5"))
            if filled:
                pool.text(phys * (b + 1) + o + 0.47, 0.5, f"k{walk.steps[step].positions[o]}",
                          ha="center", va="center", color="white", fontsize=9)
        pool.text(phys * (b + 1) + b / 2, -0.35, f"block {phys}", ha="center", fontsize=9)
        if step is not None:
            pool.text(phys * (b + 1) + b / 2, 1.35, f"read {step + 1}: logical {walk.steps[step].logical}",
                      ha="center", fontsize=10, color=colors[step % len(colors)], weight="bold")
    pool.set_xlim(-0.5, walk.num_blocks * (b + 1))
    pool.set_ylim(-0.7, 1.9)
    pool.axis("off")
    pool.set_title("the physical pool: the query reads its blocks in table order, wherever they sit")
    for i, s in enumerate(walk.steps):
        bars.bar(s.positions, [walk.weights[p] for p in s.positions], color=colors[i % len(colors)],
                 label=f"block {s.physical} (m = {s.running_max:.2f}, l = {s.running_sum:.2f} after it)")
    bars.set_xticks(range(len(walk.weights)), [f"k{p}" for p in range(len(walk.weights))])
    bars.set_ylabel("attention weight")
    bars.set_title("the final weights, by the block each key was read from (running max and sum after each block)")
    bars.legend(fontsize=8, loc="upper left")
    fig.savefig(path, dpi=110)


def main(out_dir: str = "docs/figures") -> int:
    """Write ``step03_figure5.txt`` and ``step03_figure5.png`` into ``out_dir``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    walk = figure5()
    (out / "step03_figure5.txt").write_text(render_text(walk))
    plot(walk, out / "step03_figure5.png")
    print(f"wrote {out / 'step03_figure5.txt'} and {out / 'step03_figure5.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
