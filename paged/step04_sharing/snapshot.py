"""A picture of the KV cache as plain data: the block pool, who owns each block, the queues.

The paper's §4.4 ideas are pictures — blocks filling on demand, two sequences
mapping one block, a copy on write, a block found again in the prefix cache.
``take_snapshot(engine)`` reads a live engine into one JSON-ready dict that a
renderer draws (``snapshot_html`` here for notebooks, the server's ``/kv`` page
for a running server). It carries ids and counts only, never token ids or text.

The pool is a row of *cells*. With at most ``max_cells`` cells one cell is one
block; a larger pool puts ``blocks_per_cell = ceil(num_blocks / max_cells)``
consecutive blocks in each cell (the last cell may hold fewer), so the size of
a snapshot is bounded whatever the pool. Per cell, in columns (one list per
field, cell ``i`` at index ``i``):

* ``used``   — blocks with a reference count >= 1;
* ``shared`` — blocks with a reference count > 1 (mapped by several tables);
* ``parked`` — free blocks still findable in the prefix cache;
* ``filled`` — token slots holding a token (a shared block counted once, as
  full as the fullest table that maps it);
* ``owner``  — index into ``requests`` of the request whose tables map most of the
  cell's blocks (the first listed on a tie), or -1 when nobody listed holds one.

Invariants (``tests/step04_sharing/test_snapshot.py``): with one block per cell
the columns equal the allocator's reference counts and free / parked lists;
``sum(filled)`` equals ``engine.stats()["token_slots_filled"]``; an aggregated
cell is the sum of the blocks it holds.

Extends: nothing; it reads ``BlockAllocator.ref_counts``,
``CachingBlockAllocator.parked_blocks``, the scheduler's queues and each
sequence's ``block_table``. With a host pool (step05's KV manager) it draws that
pool too, and the swapped queue: a request's table points into whichever pool
holds it (``"pool": "host"`` while swapped), and a group swapped out keeps its
sharing there, so the host pool is drawn exactly like the device pool.
"""

from __future__ import annotations

import numpy as np

from paged.step04_sharing.prefix_cache import CachingBlockAllocator

DEFAULT_MAX_CELLS = 1024  # cells per pool: the grid a page can draw and a snapshot can carry
MAX_LISTED = 256  # requests listed per queue; the rest are only counted
MAX_TABLE_ENTRIES = 256  # block-table entries listed per sequence; the rest are only counted


def blocks_per_cell(num_blocks: int, max_cells: int) -> int:
    """The aggregation rule: the fewest consecutive blocks per cell that keeps ``<= max_cells`` cells."""
    if max_cells < 1:
        raise ValueError(f"max_cells must be >= 1, got {max_cells}")
    return max(1, -(-num_blocks // max_cells))


def table_entries(table) -> list[list[int]]:
    """``[[physical block, #filled], ...]`` in logical order (logical block ``i`` at index ``i``)."""
    b, n = table.block_size, table.num_tokens
    return [[block, min(b, n - i * b)] for i, block in enumerate(table.blocks[:MAX_TABLE_ENTRIES])]


def _request_view(req, queue: str, pool_of) -> dict:
    """One request: its id, queue, arrival and each sequence's table in the pool it maps (empty once finished)."""
    seqs = []
    for seq in req.seqs:
        t = seq.block_table
        seqs.append({"seq_id": seq.seq_id, "status": seq.status.name.lower(), "pool": pool_of(t),
                     "num_tokens": t.num_tokens, "num_blocks": len(t.blocks), "table": table_entries(t)})
    return {"id": req.request_id, "queue": queue, "arrival": req.arrival, "seqs": seqs}


def pool_view(allocator, owned_tables, block_size: int, max_cells: int = DEFAULT_MAX_CELLS) -> dict:
    """One pool as cells (see the module docstring).

    Args:
        allocator: the pool's ``BlockAllocator`` (reference counts, parked blocks).
        owned_tables (list[tuple[int, BlockTable]]): ``(owner index, table)`` for every table
            mapping this pool's blocks.
        block_size: B, tokens per block.
        max_cells: most cells drawn.
    """
    n = allocator.num_blocks
    per = blocks_per_cell(n, max_cells)
    cells = -(-n // per)
    refs = np.zeros(cells * per, dtype=np.int64)  # padded to whole cells; padding counts as free
    refs[:n] = allocator.ref_counts()
    filled = np.zeros_like(refs)  # per block: the fullest table's #filled
    parked = np.zeros_like(refs)
    if isinstance(allocator, CachingBlockAllocator):
        parked[allocator.parked_blocks()] = 1
    votes: list[dict[int, int]] = [{} for _ in range(cells)]  # per cell: owner -> table entries there
    for owner, table in owned_tables:
        for i, block in enumerate(table.blocks):
            filled[block] = max(filled[block], min(block_size, table.num_tokens - i * block_size))
            v = votes[block // per]
            v[owner] = v.get(owner, 0) + 1
    per_cell = lambda column: column.reshape(cells, per).sum(axis=1).tolist()  # noqa: E731
    return {"num_blocks": n, "blocks_per_cell": per, "block_size": block_size, "num_used": allocator.num_used,
            "used": per_cell(refs > 0), "shared": per_cell(refs > 1), "parked": per_cell(parked),
            "filled": per_cell(filled),
            "owner": [min(v, key=lambda o: (-v[o], o)) if v else -1 for v in votes]}


def take_snapshot(engine, max_cells: int = DEFAULT_MAX_CELLS) -> dict:
    """Read ``engine`` (a ``SharingEngine`` or later) between iterations into a JSON-ready dict.

    Args:
        engine: the engine; only read.
        max_cells: most cells per pool.

    Returns:
        ``{"block_size", "pools": {name: pool_view}, "queues": {name: [request index]},
        "queue_lengths": {name: n}, "requests": [request view], "stats": engine.stats()}``;
        the pools are ``device`` (and ``host``), the queues ``waiting``, ``running`` (and ``swapped``).
    """
    s = engine.scheduler
    queues = [("waiting", s.waiting), ("running", s.running)]
    pools = [("device", s.kv.allocator)]
    host = getattr(s.kv, "host", None)  # step05's KV manager
    if host is not None:
        queues.append(("swapped", s.swapped))
        pools.append(("host", host))
    names = {id(alloc): name for name, alloc in pools}
    pool_of = lambda table: names.get(id(table.allocator), "?")  # noqa: E731
    requests, listed, lengths = [], {}, {}
    by_pool: dict[str, list] = {name: [] for name, _ in pools}
    for name, queue in queues:
        queue = list(queue)
        lengths[name], listed[name] = len(queue), []
        for position, req in enumerate(queue):
            owner = -1  # beyond MAX_LISTED: its blocks are drawn as used by nobody listed
            if position < MAX_LISTED:
                owner = len(requests)
                listed[name].append(owner)
                requests.append(_request_view(req, name, pool_of))
            for seq in req.seqs:
                by_pool.get(pool_of(seq.block_table), []).append((owner, seq.block_table))
    return {"block_size": engine.block_size,
            "pools": {name: pool_view(alloc, by_pool[name], engine.block_size, max_cells) for name, alloc in pools},
            "queues": listed, "queue_lengths": lengths, "requests": requests, "stats": engine.stats()}

