"""The CPU block pool and the moves between it and the device (paper §4.5, swapping).

When memory runs out the scheduler may evict a whole sequence group to host
memory. The host pool is a second ``KVCache`` of the same block shape with its
own step01 ``BlockAllocator``, so a block moves as a unit and a move of many
blocks across all layers is one indexed copy. Shared blocks stay shared across
the move: each distinct device block gets one host block, and every table
entry that mapped it maps that host block (reference counts carried over).

Moves are decided here as ``(src, dst)`` pairs for the plan; the runner copies
the data (``blocks_to_swap_out`` before ``blocks_to_swap_in``, both before the
forward pass).

Extends: step01's allocator and step02's ``KVCache`` (a second instance of each).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from paged.step01_allocator import BlockAllocator

if TYPE_CHECKING:  # the scheduler's half (the allocator and the moves) runs with no torch loaded
    from paged.step02_block_table import KVCache


class SwapSpace:
    """A host-memory pool of KV blocks shaped like the device cache.

    Args:
        num_blocks: host blocks (from ``--swap-space`` bytes).
        like: the device cache whose block shape and dtype to copy; None: only the allocator
            and the moves (the scheduler's half, for running it without a model).
    """

    def __init__(self, num_blocks: int, like: KVCache | None = None) -> None:
        self.allocator = BlockAllocator(num_blocks)
        self.cache = (
            type(like)(like.num_layers, num_blocks, like.block_size, like.num_kv_heads, like.head_dim,
                    like.dtype, "cpu") if num_blocks > 0 and like is not None else None
        )

    @staticmethod
    def distinct_blocks(tables) -> int:
        return len({b for t in tables for b in t.blocks})

    # --8<-- [start:move]
    def _move(self, tables, src_alloc: BlockAllocator, dst_alloc: BlockAllocator) -> list[tuple[int, int]]:
        """Re-map every entry of ``tables`` from ``src_alloc`` blocks to fresh ``dst_alloc`` blocks.

        Each distinct source block gets one destination block; sharing and
        reference counts are preserved. Returns the ``(src, dst)`` copies.
        """
        mapping: dict[int, int] = {}
        for table in tables:
            for i, block in enumerate(table.blocks):
                if block in mapping:
                    dst_alloc.incref(mapping[block])
                else:
                    mapping[block] = dst_alloc.allocate()
                src_alloc.decref(block)
                table.blocks[i] = mapping[block]
            table.allocator = dst_alloc
        return list(mapping.items())

    def swap_out(self, tables, device: BlockAllocator) -> list[tuple[int, int]]:
        """Move the tables' blocks to host memory; ``(device, host)`` copies."""
        return self._move(tables, device, self.allocator)

    def swap_in(self, tables, device: BlockAllocator) -> list[tuple[int, int]]:
        """Move the tables' blocks back to the device; ``(host, device)`` copies."""
        return self._move(tables, self.allocator, device)
    # --8<-- [end:move]


# --8<-- [start:copy_between]
def copy_between(src: KVCache, dst: KVCache, pairs: list[tuple[int, int]]) -> None:
    """Copy block ``s`` of ``src`` to block ``d`` of ``dst`` for every pair, all layers at once."""
    import torch  # here, not at the top: only the runner's half moves tensors

    s = torch.tensor([a for a, _ in pairs], dtype=torch.int64, device=src.device)
    d = torch.tensor([b for _, b in pairs], dtype=torch.int64, device=dst.device)
    dst.data[:, :, d] = src.data[:, :, s].to(dst.device)  # [L, 2, P, B, H_kv, D]
# --8<-- [end:copy_between]
