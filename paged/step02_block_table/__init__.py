"""Step 02 — block tables and the paged KV cache (paper §4.2–4.3, Figures 6 and 7).

Adds: ``BlockTable`` (a sequence's logical → physical block mapping, its
``#filled`` derived from the token count, its slot mapping), ``KVCache`` (one
``[L, 2, N, B, H_kv, D]`` tensor with slot-mapped ``write`` and a contiguous
``gather``) and ``Sequence`` / ``SequenceStatus``. Everything of step01 is
re-exported unchanged.
"""

from paged._lazy import lazy_package

# each name -> the module that defines it ("module:attribute" where the name differs)
_OWN = {
    "BlockTable": "block_table",
    "KVCache": "kv_cache",
    "Sequence": "sequence",
    "SequenceStatus": "sequence",
}
__all__, __getattr__, __dir__ = lazy_package(__name__, _OWN, below="paged.step01_allocator")
