"""The scheduler of step04: step03's loop with this step's two components (paper §4.4).

Sharing changes no line of the loop (``paged/step03_attention/scheduler.py``).
It swaps two of the components the loop holds:

* the KV manager — ``SharingKVManager`` (``kv_manager.py``): tables fork and
  copy on write, and a new prompt maps its cached blocks first;
* the decoding component — ``SequenceGroups`` (``decoding.py``): parallel
  samples fork when their prompt completes, beams fork and drop.

Chunking, eviction and admission stay step03's.
"""

from __future__ import annotations

from paged.step03_attention.scheduler import Scheduler
from paged.step04_sharing.decoding import SequenceGroups
from paged.step04_sharing.kv_manager import SharingKVManager


# --8<-- [start:build]
def build_scheduler(num_blocks: int, block_size: int, *, enable_prefix_caching: bool = True, free_order=None,
                    **scheduler_args) -> Scheduler:
    """Step04's scheduler: the loop over a ``SharingKVManager`` with ``SequenceGroups`` decoding.

    ``scheduler_args``: as ``Scheduler`` (the budgets, ``stops``, any other component).
    """
    kv = SharingKVManager(num_blocks, block_size, enable_prefix_caching, free_order)
    scheduler_args.setdefault("decoding", SequenceGroups())
    return Scheduler(kv, **scheduler_args)
# --8<-- [end:build]
