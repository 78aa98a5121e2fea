"""Automatic prefix caching: full blocks found again by their content (paper §4.4, Figure 10).

A full block's K/V depends only on its tokens and on every token before it, so
a block is named by a hash chained from its parent's hash and its own token
ids. A new request looks its prompt up block by block; every hit is mapped into
its table (a reference more, nothing computed), and the prompt is computed from
the first miss on. The paper's "shared prefix" — a system prompt the provider
registers ahead of time — is the same mechanism: the first request that carries
it fills the cache, later ones hit.

A hash can collide, so a hit also compares the stored token ids and parent:
a collision is a miss, never wrong K/V.

A request with a cache salt (vLLM's ``cache_salt``) names its first block with
the salt as parent, so its whole chain differs from any other salt's or none:
tenants who do not share a salt share no block, and cannot learn, by finding a
block or by timing a prompt, what another one sent.

When its last reference goes, a cached block is not forgotten: it waits in a
least-recently-used list, still findable, and is evicted (its hash dropped)
only when the pool has no never-cached free block left to give.

Invariants: ``num_free`` counts cached-but-unreferenced blocks as free (they
can be taken at any time); a block maps to at most one hash and back.

Extends: ``paged.step01_allocator.BlockAllocator`` (``allocate`` prefers
uncached blocks, then evicts; ``decref`` parks cached blocks in the LRU list).
"""

from __future__ import annotations

from collections import OrderedDict

from paged.step01_allocator import BlockAllocator, OutOfBlocksError


def block_hash(parent: int | str | None, tokens: tuple[int, ...]) -> int:
    """The name of a full block: its parent's name (a first block's: None, or its request's cache salt) and
    its own token ids."""
    return hash((parent, tokens))


class CachingBlockAllocator(BlockAllocator):
    """A ``BlockAllocator`` that remembers the content of full blocks.

    Attributes:
        hits, queries: counts of looked-up blocks found / looked up (hit rate).
    """

    def __init__(self, num_blocks: int, free_order=None) -> None:
        super().__init__(num_blocks, free_order)
        self._lru: OrderedDict[int, None] = OrderedDict()  # cached, unreferenced, oldest first
        self._by_hash: dict[int, int] = {}
        self._key: dict[int, tuple[int, int | None, tuple[int, ...]]] = {}  # block -> (hash, parent, tokens)
        self.hits = 0
        self.queries = 0

    @property
    def num_free(self) -> int:
        return len(self._free) + len(self._lru)

    @property
    def num_cached(self) -> int:
        return len(self._key)

    def free_blocks(self) -> list[int]:
        return list(self._free) + list(self._lru)

    def parked_blocks(self) -> list[int]:
        """Free blocks still findable by their content (the LRU list, next to be evicted first)."""
        return list(self._lru)

    # --8<-- [start:allocate]
    def allocate(self) -> int:
        """A never-cached free block if there is one, else evict the least recently used."""
        if self._free:
            return super().allocate()
        if not self._lru:
            raise OutOfBlocksError(f"out of KV blocks: all {self.num_blocks} blocks are in use")
        block, _ = self._lru.popitem(last=False)
        self._forget(block)
        self._ref_count[block] = 1
        return block

    def decref(self, block: int) -> bool:
        """As before, but a cached block that loses its last reference stays findable."""
        self._check_used(block)
        if self._ref_count[block] == 1 and block in self._key:
            self._ref_count[block] = 0
            self._lru[block] = None
            return True
        return super().decref(block)
    # --8<-- [end:allocate]

    # --8<-- [start:lookup]
    def lookup(self, parent: int | str | None, tokens: tuple[int, ...]) -> int | None:
        """The block holding exactly ``tokens`` after ``parent``, taking a reference; or None."""
        self.queries += 1
        h = block_hash(parent, tokens)
        block = self._by_hash.get(h)
        if block is None or self._key[block][1:] != (parent, tokens):  # miss, or a collision
            return None
        self.hits += 1
        if self._ref_count[block] == 0:  # revive it from the LRU list
            del self._lru[block]
            self._ref_count[block] = 1
        else:
            self._ref_count[block] += 1
        return block

    def peek(self, parent: int | str | None, tokens: tuple[int, ...]) -> int | None:
        """Like ``lookup`` but takes no reference and counts nothing."""
        block = self._by_hash.get(block_hash(parent, tokens))
        if block is None or self._key[block][1:] != (parent, tokens):
            return None
        return block

    def hash_of(self, block: int) -> int:
        """The hash a cached block is known by."""
        return self._key[block][0]

    def register(self, block: int, parent: int | str | None, tokens: tuple[int, ...]) -> int:
        """Name a full, used block by its content; returns its hash (the next block's parent).

        If another block already holds the same content, that one stays the
        cached copy and ``block`` remains anonymous.
        """
        self._check_used(block)
        h = block_hash(parent, tokens)
        if h not in self._by_hash and block not in self._key:
            self._by_hash[h] = block
            self._key[block] = (h, parent, tokens)
        return h
    # --8<-- [end:lookup]

    def _forget(self, block: int) -> None:
        h = self._key.pop(block)[0]
        del self._by_hash[h]
