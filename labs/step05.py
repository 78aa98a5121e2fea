"""Lab 05 — preemption: how a victim makes room, and moving its blocks to host memory (paper §4.5).

Write ``Preemption.choose`` (``paged/step05_preemption/policy.py``) and
``SwappingKVManager._move`` (``paged/step05_preemption/kv_manager.py``); ``make lab STEP=05``
runs step 05's scheduling tests (the rules, and the model-free state machine) with them in
place of the reference ones and tells you which rule or invariant broke, with Hypothesis's
smallest counterexample.

The loop that calls them is step 03's (``paged/step03_attention/scheduler.py``, ``_evict``):
when the free blocks do not cover a running group, the newest running group is the victim,
and the loop asks the eviction component how it makes room — ``"swap"`` (the loop then calls
``kv.swap_out``, which calls your ``_move``, and the group waits in the swapped queue),
``"recompute"`` (its blocks are freed; it waits to be computed again) or a finish reason to
end it with. Swapped groups come back through ``kv.swap_in`` (your ``_move`` again).

``choose(self, req, *, alone, kv)``: ``self.mode`` (``"swap"``, ``"recompute"``, ``"auto"``)
and ``self.cost`` (``num_params``, ``bytes_per_block``, ``device_type``); ``alone`` is True
when ``req`` is the only running group; ``kv`` is the KV manager (``kv.num_blocks``,
``kv.distinct_blocks(seqs)``, ``kv.host.num_free``). ``req.live_seqs`` gives the group's
sequences still generating, and ``choose`` (the module function, here as ``rank``) prices
swap against recompute.

``_move(self, seqs, src, dst)``: ``src`` and ``dst`` are the two ``BlockAllocator``s (device
and host, in either direction); each sequence has ``block_table`` (its ``blocks`` list and
its ``allocator``).
"""

import logging  # noqa: F401

from paged.step05_preemption.policy import choose as rank  # noqa: F401

logger = logging.getLogger("paged")


def choose(self, req, *, alone: bool, kv) -> str:
    """How the victim ``req`` makes room: ``"swap"``, ``"recompute"``, or ``"length"`` to end it.

    A group alone on the device that still does not fit can never continue: end it
    (``"length"``), with the warning ``"request %s needs more KV blocks than the cache has (%d);
    ending it"`` (its id, ``kv.num_blocks``) on ``logger``. Otherwise the whole group (all its live
    sequences: they share blocks) is preempted: ``rank(self.mode, live sequences, their tokens
    (``num_tokens``), their distinct blocks, the host's free blocks, *the three cost fields)``.
    """
    ...  # your code here


def _move(self, seqs, src, dst) -> list[tuple[int, int]]:
    """Re-map every entry of the tables of ``seqs`` from ``src`` blocks to fresh ``dst`` blocks.

    Each distinct source block gets ONE destination block (``dst.allocate()``); an entry that
    maps a block already moved maps the same destination block (``dst.incref``), so sharing
    and reference counts survive the move. Every entry drops its reference on the source block
    (``src.decref``). Each table then belongs to ``dst`` (its ``allocator``). Returns the
    ``(src block, dst block)`` copies for the plan, each distinct block once, in table order.
    """
    ...  # your code here
