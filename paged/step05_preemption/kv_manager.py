"""The KV manager of step05: a host block pool, and tables moved to it and back (paper §4.5, swapping).

When memory runs out the scheduler may evict a whole sequence group to host
memory. The host pool is a second ``BlockAllocator`` of the same block shape,
so a block moves as a unit. Shared blocks stay shared across the move: each
distinct device block gets one host block, and every table entry that mapped
it maps that host block (reference counts carried over).

A move here is bookkeeping only — block ids re-mapped, ``(src, dst)`` pairs
returned for the plan. The host memory itself and the copies belong to the
runner (``runner.py``), which executes ``blocks_to_swap_out`` before
``blocks_to_swap_in``, both before the forward pass.

Extends: ``paged.step04_sharing.kv_manager.SharingKVManager`` (still the one
owner of every table and block, the host pool's included).
"""

from __future__ import annotations

from paged.step01_allocator import BlockAllocator
from paged.step02_block_table import Sequence
from paged.step04_sharing.kv_manager import SharingKVManager


class SwappingKVManager(SharingKVManager):
    """``SharingKVManager`` with a host pool that groups are swapped out to.

    Args:
        num_blocks: device blocks.
        block_size: tokens per block.
        host_blocks: host blocks (from ``swap_space`` bytes; 0: no swapping).
        enable_prefix_caching: as ``SharingKVManager``.
        free_order (Iterable[int] | None): as ``SharingKVManager``.
    """

    def __init__(self, num_blocks: int, block_size: int, host_blocks: int = 0, enable_prefix_caching: bool = True,
                 free_order=None) -> None:
        super().__init__(num_blocks, block_size, enable_prefix_caching, free_order)
        self.host = BlockAllocator(host_blocks)

    # --8<-- [start:move]
    def _move(self, seqs: list[Sequence], src: BlockAllocator, dst: BlockAllocator) -> list[tuple[int, int]]:
        """Re-map every entry of the tables of ``seqs`` from ``src`` blocks to fresh ``dst`` blocks.

        Each distinct source block gets one destination block; sharing and
        reference counts are preserved. Returns the ``(src, dst)`` copies.
        """
        mapping: dict[int, int] = {}
        for seq in seqs:
            table = seq.block_table
            for i, block in enumerate(table.blocks):
                if block in mapping:
                    dst.incref(mapping[block])
                else:
                    mapping[block] = dst.allocate()
                src.decref(block)
                table.blocks[i] = mapping[block]
            table.allocator = dst
        return list(mapping.items())

    def swap_out(self, seqs: list[Sequence]) -> list[tuple[int, int]]:
        """Move the tables of ``seqs`` to host memory; ``(device, host)`` copies."""
        return self._move(seqs, self.allocator, self.host)

    def swap_in(self, seqs: list[Sequence]) -> list[tuple[int, int]]:
        """Move the tables of ``seqs`` back to the device; ``(host, device)`` copies."""
        return self._move(seqs, self.host, self.allocator)
    # --8<-- [end:move]

    def usage(self, seqs) -> dict:
        return {**super().usage(seqs), "swap_blocks_used": self.host.num_used,
                "swap_blocks_total": self.host.num_blocks}
