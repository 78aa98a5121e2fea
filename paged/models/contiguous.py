"""``ContiguousAttention``: the step02-era KV cache, one growing tensor per sequence and layer.

This is the test-side path the models are checked with before paging
exists: before each forward pass ``begin(seq_ids, query_lens)`` says how the
packed tokens split into sequences; each layer call appends the new keys and
values to that sequence's contiguous K/V and runs causal scaled-dot-product
attention over them (``paged.kernels.contiguous.causal_attention``, the one
oracle). The loop over sequences is deliberate and lives only here: it is the
plain reference the engine's paged path is compared with.
"""

from __future__ import annotations

import torch

from paged.kernels.contiguous import causal_attention


class ContiguousAttention:
    """An ``Attention`` (see ``paged.models.attention``) over per-sequence contiguous K/V tensors.

    Args:
        num_layers: L, the model's layer count.
    """

    def __init__(self, num_layers: int):
        self.num_layers = num_layers
        self._kv: dict[object, list[tuple[torch.Tensor, torch.Tensor] | None]] = {}
        self._batch: list[tuple[object, int]] = []

    def begin(self, seq_ids: list, query_lens: list[int]) -> None:
        """Declare the next forward pass: sequence ``seq_ids[i]`` contributes the next ``query_lens[i]``
        packed tokens. Unknown ids start empty sequences.

        Raises:
            ValueError: lengths differ, an id repeats, or a length is negative (nothing changes).
        """
        if len(seq_ids) != len(query_lens):
            raise ValueError(f"{len(seq_ids)} seq_ids but {len(query_lens)} query_lens")
        if len(set(seq_ids)) != len(seq_ids):
            raise ValueError(f"seq_ids repeat: {seq_ids}")
        if any(n < 0 for n in query_lens):
            raise ValueError(f"query_lens must be >= 0, got {query_lens}")
        for sid in seq_ids:
            self._kv.setdefault(sid, [None] * self.num_layers)
        self._batch = list(zip(seq_ids, query_lens))

    def context_len(self, seq_id) -> int:
        """Tokens stored for ``seq_id`` (in layer 0)."""
        kv = self._kv[seq_id][0]
        return 0 if kv is None else kv[0].shape[0]

    def free(self, seq_id) -> None:
        """Forget a finished sequence's K/V.

        Raises:
            KeyError: ``seq_id`` is not cached.
        """
        del self._kv[seq_id]

    def __call__(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, *,
                 window: int | None = None, softcap: float | None = None) -> torch.Tensor:
        """Append ``k``/``v`` per sequence and attend; shapes and options as in ``Attention``. All keys are
        kept: a window masks the old ones, it does not drop them."""
        lens = [n for _, n in self._batch]
        if q.shape[0] != sum(lens):
            raise ValueError(f"got {q.shape[0]} tokens but begin() declared {sum(lens)}")
        outs = []
        for (sid, _), q_s, k_s, v_s in zip(self._batch, q.split(lens), k.split(lens), v.split(lens)):
            cached = self._kv[sid][layer]
            if cached is not None:
                k_s, v_s = torch.cat((cached[0], k_s)), torch.cat((cached[1], v_s))
            self._kv[sid][layer] = (k_s, v_s)  # [T_k, H_kv, D] each
            if q_s.shape[0]:
                outs.append(causal_attention(q_s, k_s, v_s, scale, window, softcap))
        return torch.cat(outs) if outs else q.new_empty(q.shape)
