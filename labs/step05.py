"""Lab 05 — preemption: evict a whole group, and bring swapped groups back first (paper §4.5).

Write ``PreemptingScheduler._preempt`` and ``PreemptingScheduler._resume_swapped``;
``make lab STEP=05`` runs step 05's scheduling tests (the rules, and the model-free state
machine) with them in place of the reference ones (``paged/step05_preemption/scheduler.py``)
and tells you which rule or invariant broke, with Hypothesis's smallest counterexample.

The loop that calls them is step 03's: when the free blocks do not cover a running group, the
newest running group is the victim, and ``_evict`` hands it to your ``_preempt`` (unless it is
alone on the device). Every iteration, ``_admit`` calls your ``_resume_swapped`` first, and
admits new requests only if nobody is left swapped out.

What you have on ``self``: the queues ``self.running`` (a list), ``self.swapped`` and
``self.waiting`` (deques, each in arrival order; ``self._insert(queue, req)`` keeps that order),
``self.allocator`` (the device pool: ``num_free``), ``self.swap`` (the host pool, a
``SwapSpace``: ``swap_out(tables, self.allocator)`` / ``swap_in(tables, self.allocator)`` move
tables and return the ``(src, dst)`` copies; ``self.swap.allocator.num_free``),
``self.block_manager.free(table)``, ``self.preemption_mode`` and ``self._cost`` (for
``policy.choose``), ``self.preemptions`` (a count per mode), ``self._record(kind, req, **detail)``
(the events the tests read: ``"preempted"`` with ``mode=``, ``"swapped_out"`` and
``"swapped_in"`` with ``blocks=``), and for ``_resume_swapped``: ``self._fit_to_budget(req,
budget, plan)`` (the group's work this iteration, None when the budgets are spent),
``self._blocks_needed(work)``, ``self._give_slots(plan, req, work, budget)`` and
``self._evict(req, plan)``. A request's sequences are ``req.seqs`` (skip the ``is_finished``
ones); a sequence has ``block_table`` and ``status``.
"""

from paged.step02_block_table import SequenceStatus  # noqa: F401
from paged.step05_preemption import policy  # noqa: F401
from paged.step05_preemption.swap import SwapSpace  # noqa: F401


def _preempt(self, req, plan) -> None:
    """Evict the whole group ``req`` (all its live sequences: they share blocks), by swap or recompute.

    The mode: ``policy.choose(self.preemption_mode, live sequences, their tokens, distinct blocks
    (SwapSpace.distinct_blocks(tables)), self.swap.allocator.num_free, *self._cost)``. Take ``req``
    out of ``self.running``, count it in ``self.preemptions[mode]`` and record ``"preempted"``.

    * swap: move every table to the host pool, add the copies to ``plan.blocks_to_swap_out``,
      record ``"swapped_out"``, mark each sequence ``SequenceStatus.SWAPPED``, insert ``req`` in
      ``self.swapped``;
    * recompute: free every table (and point it back at ``self.allocator``), mark each sequence
      ``SequenceStatus.WAITING``, insert ``req`` in ``self.waiting`` (it is computed again later).
    """
    ...  # your code here


def _resume_swapped(self, plan, budget) -> None:
    """Bring swapped groups back to the device, oldest first, while they fit.

    For the oldest swapped group: its work is ``self._fit_to_budget(req, budget, plan)``; stop if
    that is None, or if the free device blocks do not cover its distinct blocks plus one block per
    live sequence for its next token (no reserve when nothing else is running: alone, it needs
    only its blocks back). Otherwise swap its tables in (copies to ``plan.blocks_to_swap_in``),
    record ``"swapped_in"``, move it from ``self.swapped`` to ``self.running``, and give it its
    slots if ``self._blocks_needed(work)`` fit; if they do not and it is alone on the device,
    ``self._evict`` it (it outgrew the pool). Then the next oldest.
    """
    ...  # your code here
