"""The one oracle (docs/architecture.md): plain contiguous attention over one sequence.

Every equivalence test, at every step, compares a paged result with
``contiguous_attention`` applied to the contiguous keys and values of the same
sequence. It is the package's own ``causal_sdpa`` (so the reference paged path,
which gathers and then calls it, is bitwise equal exactly when the gather is
right), and ``test_oracle.py`` checks it once against softmax written out by
hand in float64.

    contiguous_attention(q [T_q, H, D], k [T_k, H_kv, D], v [T_k, H_kv, D], scale) -> [T_q, H, D]

Query ``i`` sits at position ``T_k - T_q + i`` and sees keys ``0 ..`` that
position; query head ``h`` reads KV head ``h // (H // H_kv)``.
"""

from paged.step03_attention.reference import causal_sdpa as contiguous_attention

__all__ = ["contiguous_attention"]
