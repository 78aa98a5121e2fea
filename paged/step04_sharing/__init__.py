"""Step 04 — memory sharing: fork, copy-on-write, beam search, prefix caching (paper §4.4).

Adds: ``CowBlockTable`` (fork and copy-on-write), ``CachingBlockAllocator``
(automatic prefix caching by chained block hashes, LRU eviction),
``BlockManager`` (the paper's fork / append / free), ``SharingModelRunner``
(one fused block copy per iteration; one prompt sampled by many sequences),
``SharingScheduler`` (step03's scheduler over the block manager: forks,
copy-on-write, beams, prefix lookups), ``SharingEngine`` (parallel sampling, beam search, mixed batches) and the
step's ``LLM``. ``LLM`` here shadows step03's name on purpose: it is the same
API over this step's engine.
"""

from paged.step03_attention import *  # noqa: F401,F403  (the ladder: re-export step03)
from paged.step03_attention import __all__ as _step03_all
from paged.step04_sharing.beam import Hypothesis, beam_score
from paged.step04_sharing.block_manager import BlockManager
from paged.step04_sharing.cow_table import CowBlockTable
from paged.step04_sharing.engine import SharingEngine
from paged.step04_sharing.llm import LLM
from paged.step04_sharing.request import GroupRequest
from paged.step04_sharing.prefix_cache import CachingBlockAllocator, block_hash
from paged.step04_sharing.runner import SharingModelRunner, SharingStepPlan, copy_blocks
from paged.step04_sharing.scheduler import SharingScheduler, sample_seed

__all__ = [n for n in _step03_all if n != "LLM"] + [
    "BlockManager",
    "CachingBlockAllocator",
    "CowBlockTable",
    "GroupRequest",
    "Hypothesis",
    "LLM",
    "SharingEngine",
    "SharingModelRunner",
    "SharingScheduler",
    "SharingStepPlan",
    "beam_score",
    "block_hash",
    "copy_blocks",
    "sample_seed",
]
