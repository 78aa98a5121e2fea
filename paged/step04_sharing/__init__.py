"""Step 04 — memory sharing: fork, copy-on-write, beam search, prefix caching (paper §4.4).

Adds: ``CowBlockTable`` (fork and copy-on-write), ``CachingBlockAllocator``
(automatic prefix caching by chained block hashes, LRU eviction),
``SharingKVManager`` (the KV manager with the paper's fork / append / free and the
prefix cache), ``SequenceGroups`` (the decoding component: parallel samples and beam
search), ``SharingModelRunner`` (one fused block copy per iteration; one prompt sampled
by many sequences), ``SharingEngine`` (step03's scheduler loop with those two
components; mixed batches) and the step's ``LLM``. ``LLM`` here shadows step03's name on purpose: it is the same
API over this step's engine.
"""

from paged._lazy import lazy_package

# each name -> the module that defines it ("module:attribute" where the name differs)
_OWN = {
    "CachingBlockAllocator": "prefix_cache",
    "CowBlockTable": "cow_table",
    "GroupRequest": "request",
    "Hypothesis": "beam",
    "SharingEngine": "engine",
    "SequenceGroups": "decoding",
    "SharingKVManager": "kv_manager",
    "SharingModelRunner": "runner",
    "beam_score": "beam",
    "block_hash": "prefix_cache",
    "copy_blocks": "runner",
    "sample_seed": "decoding",
    "LLM": "llm",
}
__all__, __getattr__, __dir__ = lazy_package(__name__, _OWN, below="paged.step03_attention")
