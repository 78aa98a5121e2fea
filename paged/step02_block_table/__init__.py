"""Step 02 — block tables and the paged KV cache (paper §4.2–4.3, Figures 6 and 7).

Adds: ``BlockTable`` (a sequence's logical → physical block mapping, its
``#filled`` derived from the token count, its slot mapping), ``KVCache`` (one
``[L, 2, N, B, H_kv, D]`` tensor with slot-mapped ``write`` and a contiguous
``gather``) and ``Sequence`` / ``SequenceStatus``. Everything of step01 is
re-exported unchanged.
"""

from paged.step01_allocator import *  # noqa: F401,F403  (the ladder: re-export step01)
from paged.step01_allocator import __all__ as _step01_all
from paged.step02_block_table.block_table import BlockTable
from paged.step02_block_table.kv_cache import KVCache
from paged.step02_block_table.sequence import Sequence, SequenceStatus

__all__ = [
    *_step01_all,
    "BlockTable",
    "KVCache",
    "Sequence",
    "SequenceStatus",
]
