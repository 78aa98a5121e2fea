"""What the indirection costs: paged write and gather against a contiguous buffer (§4.3).

A contiguous KV cache writes a new token with a slice assignment and hands its
keys to attention as a view. The paged cache scatters each token to its slot
and, on step03's reference path, *copies* the sequence's blocks into a
contiguous tensor first. This measures both, for several block sizes, in one
process, and reports them as ratios to the contiguous baseline (absolute times
on shared machines are noisy; ratios travel). Step03's block-wise attention and
kernels exist to avoid the gather copy.

Run::

    python -m paged.step02_block_table.measure [--tokens 2048] [--out docs/figures/step02_measure.txt]

Extends: nothing; it drives ``BlockTable`` and ``KVCache``.
"""

from __future__ import annotations

import argparse
import datetime
import platform
import random
import statistics
import sys
import time

import torch

from paged.step01_allocator import BlockAllocator
from paged.step02_block_table.block_table import BlockTable
from paged.step02_block_table.kv_cache import KVCache


def _median_us(fns: list, repeats: int) -> list[float]:
    """Median µs of each function, timed in interleaved rounds.

    Interleaving puts the paged call and its contiguous baseline under the same
    load, so their ratio stays meaningful on a busy machine.
    """
    for fn in fns:
        fn()  # warm-up
    times = [[] for _ in fns]
    for _ in range(repeats):
        for fn, ts in zip(fns, times):
            start = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - start)
    return [statistics.median(ts) * 1e6 for ts in times]


def measure(
    num_tokens: int = 2048,
    block_sizes: tuple[int, ...] = (1, 4, 16, 64),
    num_kv_heads: int = 8,
    head_dim: int = 64,
    dtype: torch.dtype = torch.float32,
    repeats: int = 30,
) -> list[dict]:
    """One row per block size: write and gather times, and ratios to contiguous.

    Args:
        num_tokens: ``T``, the length of the one sequence measured.
        block_sizes: the ``B`` values to compare.
        num_kv_heads: ``H_kv`` of one token's K (and V).
        head_dim: ``D``.
        dtype: element type of the K/V.
        repeats: timed runs per number (the median is kept).

    Returns:
        Dicts with ``B``, ``blocks``, the median microseconds of a prefill
        ``write`` of all ``T`` tokens, of a one-token decode ``write``, of
        ``gather``, and the same for the contiguous baseline.
    """
    gen = torch.Generator().manual_seed(0)
    k = torch.randn(num_tokens, num_kv_heads, head_dim, generator=gen).to(dtype)  # [T, H_kv, D]
    v = torch.randn(num_tokens, num_kv_heads, head_dim, generator=gen).to(dtype)
    # Contiguous baseline: one buffer per sequence, write = slice assignment.
    buf = torch.zeros(2, num_tokens, num_kv_heads, head_dim, dtype=dtype)  # [2, T, H_kv, D]

    def contiguous_prefill():
        buf[0, :num_tokens] = k
        buf[1, :num_tokens] = v

    def contiguous_decode():
        buf[0, num_tokens - 1] = k[-1]
        buf[1, num_tokens - 1] = v[-1]

    rows = []
    for b in block_sizes:
        n = -(-num_tokens // b)
        order = list(range(n))
        random.Random(b).shuffle(order)  # physical blocks scattered, as in a busy pool
        table = BlockTable(BlockAllocator(n, free_order=order), b)
        cache = KVCache(1, n, b, num_kv_heads, head_dim, dtype)
        slots = torch.tensor(table.append(num_tokens), dtype=torch.int64)  # [T]
        last = slots[-1:]  # [1]
        prefill, base_prefill = _median_us(
            [lambda: cache.write(0, k, v, slots), contiguous_prefill], repeats)
        decode, base_decode = _median_us(
            [lambda: cache.write(0, k[-1:], v[-1:], last), contiguous_decode], repeats)
        gather, base_read = _median_us(
            [lambda: cache.gather(0, table.blocks, num_tokens),
             lambda: buf[:, :num_tokens].clone()], repeats)
        rows.append({
            "B": b, "blocks": n,
            "prefill_us": prefill, "decode_us": decode, "gather_us": gather,
            "contiguous_prefill_us": base_prefill, "contiguous_decode_us": base_decode,
            "contiguous_read_us": base_read,
        })
    return rows


def format_rows(rows: list[dict], num_tokens: int, dtype: torch.dtype) -> str:
    """A plain-text table with the machine and date, ratios to the contiguous buffer."""
    head = (
        f"paged vs contiguous KV, one sequence of {num_tokens} tokens, {dtype}, "
        f"{platform.machine()} {platform.system()}, torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads, {datetime.date.today().isoformat()}\n"
        "(median µs; x = ratio to the contiguous buffer: slice write / clone of K and V)\n"
    )
    lines = [head, f"{'B':>4} {'blocks':>6} │ {'prefill write':>18} │ {'decode write':>18} │ {'gather (K and V)':>18}"]
    for r in rows:
        def cell(name, base):
            return f"{r[name]:8.1f} ({r[name] / r[base]:5.1f}x)"
        lines.append(
            f"{r['B']:>4} {r['blocks']:>6} │ {cell('prefill_us', 'contiguous_prefill_us'):>18} │ "
            f"{cell('decode_us', 'contiguous_decode_us'):>18} │ {cell('gather_us', 'contiguous_read_us'):>18}"
        )
    lines.append("(attention over a contiguous cache reads a view of it: no copy at all)")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=2048)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads (1 keeps a shared machine's noise down)")
    parser.add_argument("--out", help="also write the table to this file")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    rows = measure(args.tokens, repeats=args.repeats)
    text = format_rows(rows, args.tokens, torch.float32)
    print(text, end="")
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
