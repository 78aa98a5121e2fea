"""The scheduler of step05: step03's loop under memory pressure — gang preemption, swap and recompute (paper §4.5).

The loop (``paged/step03_attention/scheduler.py``) already walks three queues,
oldest request first — running (decodes, then prompt chunks), swapped (back
when their blocks fit), waiting (only when nobody is swapped out) — and
evicts the newest running group whole when the free blocks do not cover the
group being served. Before step05 the victim ends and the swapped queue stays
empty. Step05 swaps three components:

* eviction — ``Preemption`` (``policy.py``): the victim is preempted, by swap
  or by recompute, instead of ended;
* the KV manager — ``SwappingKVManager`` (``kv_manager.py``): a host pool the
  victim's tables move to, and back;
* chunking — ``ChunkedPrefill`` (``chunked.py``): a prompt longer than the
  token budget is prefilled over several iterations;

and, when asked, a fourth:

* order — ``FairShare`` (``fair.py``; the server's default): the client with
  the fewest requests running first, first-come-first-served within a client;
  or ``PriorityFirst`` (``priority.py``): the smallest request ``priority``
  first, first-come-first-served within a priority.

Budgets: ``max_num_seqs`` sequences and ``max_num_batched_tokens`` tokens per
iteration.
"""

from __future__ import annotations

from paged.step03_attention.scheduler import Scheduler
from paged.step04_sharing.decoding import SequenceGroups
from paged.step05_preemption.chunked import ChunkedPrefill
from paged.step05_preemption.kv_manager import SwappingKVManager
from paged.step05_preemption.policy import Cost, Preemption


# --8<-- [start:build]
def build_scheduler(num_blocks: int, block_size: int, *, host_blocks: int = 0, preemption_mode: str = "auto",
                    cost: Cost = Cost(), enable_prefix_caching: bool = True, free_order=None,
                    **scheduler_args) -> Scheduler:
    """Step05's scheduler: the loop over a ``SwappingKVManager`` with ``Preemption`` eviction,
    ``ChunkedPrefill`` chunking and step04's ``SequenceGroups`` decoding.

    ``scheduler_args``: as ``Scheduler`` (the budgets, ``stops``, any other component).
    """
    eviction = Preemption(preemption_mode, cost)
    kv = SwappingKVManager(num_blocks, block_size, host_blocks, enable_prefix_caching, free_order)
    scheduler_args.setdefault("chunking", ChunkedPrefill())
    scheduler_args.setdefault("decoding", SequenceGroups())
    return Scheduler(kv, eviction=eviction, **scheduler_args)
# --8<-- [end:build]
