"""The KV manager of step04: fork / append / free over shared blocks, with prefix caching (paper §4.4).

The paper's three primitives, on top of step01's allocator and step02's tables:

* ``fork(seq)`` — a child table mapping the same blocks (``CowBlockTable.fork``);
* ``allocate`` — slots for new tokens, copy-on-write when the last block is
  shared (``CowBlockTable.append``); the copies are collected for the plan
  (``take_copies``);
* ``free(seq)`` — drop one reference per block.

Prefix caching (``prefix_cache.py``) plugs in at two points: ``allocate_prompt``
maps the cached full blocks of a prompt before allocating the rest, and
``register_full_blocks`` names a table's blocks once their K/V is written
(``written``). The block holding the last prompt token is never taken from the
cache: it is always computed, so the prompt's logits exist and generated
tokens never write into a block another request may be reading.

Extends: ``paged.step03_attention.kv_manager.KVManager`` (it stays the one owner
of every table and block); composes ``CowBlockTable`` and ``CachingBlockAllocator``.
"""

from __future__ import annotations

from paged.step01_allocator import BlockAllocator, OutOfBlocksError
from paged.step02_block_table import Sequence
from paged.step03_attention.kv_manager import KVManager
from paged.step04_sharing.cow_table import CowBlockTable
from paged.step04_sharing.prefix_cache import CachingBlockAllocator


class SharingKVManager(KVManager):
    """``KVManager`` whose tables share blocks: forks, copy-on-write and the prefix cache.

    Args:
        num_blocks: physical blocks in the pool.
        block_size: tokens per block.
        enable_prefix_caching: find and reuse full blocks by content.
        free_order (Iterable[int] | None): initial free-list order (tests shuffle it).
    """

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True,
                 free_order=None) -> None:
        self.caching = enable_prefix_caching
        super().__init__(num_blocks, block_size, free_order)

    def _pool(self, num_blocks: int, free_order) -> BlockAllocator:
        return (CachingBlockAllocator if self.caching else BlockAllocator)(num_blocks, free_order)

    def new_table(self, req=None, reuse_cached: bool | None = None) -> CowBlockTable:
        """An empty table. Its prompt maps no cached block when ``reuse_cached`` is False — by default,
        for a request that wants prompt logprobs (cached blocks have no logits); its blocks are named
        with its request's ``cache_salt`` (shared only with requests of the same salt)."""
        table = CowBlockTable(self.allocator, self.block_size)
        if reuse_cached is None:
            reuse_cached = req is None or req.params.prompt_logprobs is None
        table.reuse_cached = reuse_cached
        table.salt = None if req is None else req.params.cache_salt
        return table

    # -- the scheduler's questions -------------------------------------------------
    def blocks_needed(self, work) -> int:
        """As step03, but a sequence with no K/V yet (a new prompt or a recomputation) maps its
        cached prompt blocks first: a hit on a block in use takes no free block."""
        need = 0
        for seq, n in work:
            table = seq.block_table
            if table.num_tokens == 0:
                need += self.blocks_needed_for_prompt(seq.token_ids, n, table.reuse_cached, table.salt)
            else:
                need += table.slots_for(n)
        return need

    # --8<-- [start:allocate]
    def allocate(self, seq: Sequence, n: int) -> tuple[int, list[int], int]:
        """A sequence with no K/V yet maps the cached blocks of its prompt, then gets slots for the rest."""
        table = seq.block_table
        if table.num_tokens > 0:
            return super().allocate(seq, n)
        cached, slots = self.allocate_prompt(table, seq.token_ids, n)
        return cached, slots, cached
    # --8<-- [end:allocate]

    def take_copies(self, seq: Sequence) -> list[tuple[int, int]]:
        """The copy-on-writes ``seq``'s table queued since the last call, oldest first."""
        return seq.block_table.take_copies()

    def written(self, seq: Sequence) -> None:
        """Name every full block of ``seq`` whose K/V is now written, for later prompts to find."""
        if self.has_unnamed_full_blocks(seq.block_table):
            self.register_full_blocks(seq.block_table, seq.token_ids)

    def fork(self, seq: Sequence) -> CowBlockTable:
        """A child table of ``seq``'s: the same blocks, each with one more reference; no K/V copied. It names
        its blocks under the same cache salt."""
        child = seq.block_table.fork()
        child.salt = seq.block_table.salt
        return child

    # -- the prefix cache ----------------------------------------------------------
    def _cacheable_blocks(self, prompt: list[int]) -> int:
        """Full prompt blocks that lie wholly before the block of the last prompt token."""
        return (len(prompt) - 1) // self.block_size

    def blocks_needed_for_prompt(self, prompt: list[int], num_new: int | None = None,
                                 reuse_cached: bool = True, salt: str | None = None) -> int:
        """Free blocks ``allocate_prompt(…, num_new)`` would consume (hits on parked blocks count)
        for a table whose ``reuse_cached`` and ``salt`` are as given."""
        hit_blocks = self._hits(prompt, salt) if self.caching and reuse_cached else []
        cached = len(hit_blocks) * self.block_size
        upto = len(prompt) if num_new is None else min(len(prompt), cached + num_new)
        total = -(-upto // self.block_size)
        return total - sum(self.allocator.ref_count(b) > 0 for b in hit_blocks)

    def _hits(self, prompt: list[int], salt: str | None) -> list[int]:
        """The cached blocks ``allocate_prompt`` would map, taking no reference."""
        hits, parent, b = [], salt, self.block_size
        for i in range(self._cacheable_blocks(prompt)):
            block = self.allocator.peek(parent, tuple(prompt[i * b:(i + 1) * b]))
            if block is None:
                break
            hits.append(block)
            parent = self.allocator.hash_of(block)
        return hits

    # --8<-- [start:allocate_prompt]
    def allocate_prompt(self, table: CowBlockTable, prompt: list[int],
                        num_new: int | None = None) -> tuple[int, list[int]]:
        """Map cached blocks, then slots for the rest (at most ``num_new`` tokens of it, for a
        prompt computed in chunks); returns (cached tokens, slots of the new tokens).

        All or nothing: out of blocks raises ``OutOfBlocksError`` with every
        reference taken here given back.
        """
        hashes, parent, b = [], table.salt, self.block_size  # the first block's parent: the salt, if any
        if self.caching and table.reuse_cached:
            for i in range(self._cacheable_blocks(prompt)):
                tokens = tuple(prompt[i * b:(i + 1) * b])
                block = self.allocator.lookup(parent, tokens)
                if block is None:
                    break
                table.blocks.append(block)
                table.num_tokens += b
                parent = self.allocator.hash_of(block)
                hashes.append(parent)
        cached = table.num_tokens
        try:
            rest = len(prompt) - cached
            slots = table.append(rest if num_new is None else min(rest, num_new))
        except OutOfBlocksError:
            table.free()
            raise
        table.hashes = hashes
        return cached, slots
    # --8<-- [end:allocate_prompt]

    def has_unnamed_full_blocks(self, table: CowBlockTable) -> bool:
        """Whether ``register_full_blocks`` has anything to do (cheap: no token list needed).

        Most decode steps fill no block, so the scheduler asks this before building
        a sequence's token list.
        """
        return self.caching and table.num_tokens // self.block_size > len(table.hashes)

    def register_full_blocks(self, table: CowBlockTable, token_ids: list[int]) -> None:
        """Name every full block of ``table`` whose K/V is now written (``token_ids``: its tokens)."""
        if not self.has_unnamed_full_blocks(table):
            return
        hashes = table.hashes
        b = self.block_size
        for i in range(len(hashes), table.num_tokens // b):
            parent = hashes[-1] if hashes else table.salt
            hashes.append(self.allocator.register(table.blocks[i], parent, tuple(token_ids[i * b:(i + 1) * b])))

    def hit_rate(self) -> float:
        a = self.allocator
        return a.hits / a.queries if self.caching and a.queries else 0.0

    def usage(self, seqs) -> dict:
        return {**super().usage(seqs), "prefix_cache_hit_rate": self.hit_rate()}
