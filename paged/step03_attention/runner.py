"""``ModelRunner``: a worker that executes ``StepPlan``s (docs/architecture.md).

It owns the model and the ``KVCache`` and makes no memory decisions. Each
iteration: the plan's lists become tensors once; one forward pass runs over
every scheduled token of every sequence (prompts and decodes packed together);
logits are computed only for the rows that sample; one vectorised sampling
call draws a token for each of them. The only device-to-host transfer is the
sampled ids (and log-probabilities when asked).

Greedy fast path: when every row is greedy and asks for no log-probabilities,
the draw is the argmax of each row, taken straight from the logits in their
own dtype (one fused pass on a CPU) instead of through the sampler's float32
copy. Widening bfloat16 to float32 is exact, so the tokens are the sampler's
bit for bit (``tests/step03_attention/test_fused_ops.py``).
"""

from __future__ import annotations

import torch

from paged.kernels.cpu import fused_ops
from paged.models.layers import prepack_linears
from paged.step02_block_table import KVCache
from paged.step03_attention.attention import AttentionMetadata, PagedAttention
from paged.step03_attention.plan import StepPlan
from paged.step03_attention.sampler import SampleResult, num_top_logprobs, sample


class ModelRunner:
    """Runs plans against one model and its paged KV cache.

    Args:
        model: a ``paged.models`` causal LM.
        kv_cache: the paged cache, sized by the engine.
        backend: attention path name (``backends.resolve_backend``).
    """

    def __init__(self, model: torch.nn.Module, kv_cache: KVCache, backend: str) -> None:
        self.model, self.kv_cache, self.backend = model, kv_cache, backend
        self.device = kv_cache.data.device
        prepack_linears(model)  # serving from here on: oneDNN-packed weights on a CPU in bfloat16
        self._generators: dict[int, torch.Generator] = {}

    # --8<-- [start:execute]
    def execute(self, plan: StepPlan) -> dict[int, SampleResult]:
        """Run one iteration; returns the token drawn by each sequence that samples."""
        self.execute_memory_ops(plan)
        for seq_id in plan.finished_seq_ids:
            self._generators.pop(seq_id, None)
        if not plan.seq_ids:
            return {}
        meta = AttentionMetadata.build(
            plan.slot_mapping, plan.block_tables, plan.context_lens, plan.query_lens, self.device
        )
        input_ids = torch.tensor(plan.input_ids, dtype=torch.int64, device=self.device)
        positions = torch.tensor(plan.positions, dtype=torch.int64, device=self.device)
        with torch.inference_mode():
            hidden = self.model(input_ids, positions, PagedAttention(self.kv_cache, meta, self.backend))
            rows = self._sample_rows(plan)  # (seq_id, token row, params, seed)
            if not rows:
                return {}
            idx = torch.tensor([r[1] for r in rows], device=self.device)
            logits = self.model.compute_logits(hidden[idx])  # [S', V]
            return self._draw(logits, rows)
    # --8<-- [end:execute]

    def _draw(self, logits: torch.Tensor, rows: list) -> dict[int, SampleResult]:
        """One vectorised sampling call over the rows' logits ``[S', V]`` (under tensor parallelism,
        only rank 0 draws)."""
        if all(p.greedy and num_top_logprobs(p) is None for _, _, p, _ in rows):
            tokens = greedy_tokens(logits).tolist()
            return {r[0]: SampleResult(t) for r, t in zip(rows, tokens)}
        results = sample(logits, [r[2] for r in rows], [self._generator(r[0], r[3]) for r in rows])
        return {r[0]: res for r, res in zip(rows, results)}

    def _sample_rows(self, plan: StepPlan) -> list[tuple[int, int, object, int]]:
        """Which sequence draws from which packed token row: each sampling sequence's last token."""
        rows, last = [], -1
        for s, q_len in enumerate(plan.query_lens):
            last += q_len
            if plan.sample[s]:
                rows.append((plan.seq_ids[s], last, plan.sampling_params[s], plan.seeds[s]))
        return rows

    def execute_memory_ops(self, plan: StepPlan) -> None:
        """Block copies before the forward pass (step03 has none; steps 04-05 add them)."""
        if plan.has_memory_ops:
            raise NotImplementedError("memory operations arrive with step04 (copy) and step05 (swap)")

    def _generator(self, seq_id: int, seed: int) -> torch.Generator:
        g = self._generators.get(seq_id)
        if g is None:
            g = self._generators[seq_id] = torch.Generator().manual_seed(seed)
        return g


def greedy_tokens(logits: torch.Tensor) -> torch.Tensor:  # [S, V] -> [S] int64
    """``logits.argmax(dim=1)``: the first index of each row's largest value (a NaN wins, as in torch)."""
    ops = fused_ops(logits)
    if ops is not None and logits.stride(-1) == 1:
        return ops.argmax_rows(logits)
    return logits.argmax(dim=1)
