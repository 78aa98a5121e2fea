"""Lab 06 — tensor parallelism: the column and the row split of a weight (paper §4.6).

A linear layer's weight is ``[out, in]``. Column parallel: rank ``r`` of ``W`` keeps ``out/W``
output rows (each rank computes its own heads, no communication). Row parallel: it keeps
``in/W`` input columns (each rank computes a partial sum, one all-reduce adds them). Write the
two functions that say which slice of the checkpoint tensor each rank reads;
``make lab STEP=06`` runs step 06's sharding tests with them in place of the reference ones
(``paged/step06_tensor_parallel/sharding.py``): each rank must load exactly its slices, and
``W`` shards combined as the collectives combine them must equal the unsharded model.

A read is ``(checkpoint name, first row in the rank's weight, rows, index)``; ``index`` is a
tuple of slices into the checkpoint tensor (``(slice(a, b),)`` for rows, ``(slice(None),
slice(a, b))`` for columns).
"""


def column_reads(parts, rank, world_size):
    """Rank ``rank`` of ``world_size``: ``1/W`` of the output rows of every part.

    Args:
        parts: ``(checkpoint name, first row in the fused weight, rows n)`` per part: q, k, v of
            a fused qkv projection (each split on its own, so a rank gets matching heads of
            each), gate and up, or the one part of a plain linear.

    Returns:
        Per part: ``(name, row // W, n // W, (slice(rows of this rank),))``.
    """
    return []  # your code here


def row_reads(parts, in_features, rank):
    """Rank ``rank``'s block of ``in_features`` input columns of a row-parallel weight.

    Args:
        parts: the single ``(checkpoint name, 0, rows n)`` of the weight.
        in_features: ``k``, this rank's share of the input width.

    Returns:
        One read: ``(name, 0, n, (slice(None), slice(columns of this rank)))``.
    """
    return []  # your code here
