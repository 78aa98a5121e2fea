"""``ModelRunner``: a worker that executes ``StepPlan``s (docs/architecture.md).

It owns the model and the ``KVCache`` and makes no memory decisions. Each
iteration: the plan's lists become tensors once; one forward pass runs over
every scheduled token of every sequence (prompts and decodes packed together);
logits are computed only for the rows that sample (and, for a request that
asks for prompt logprobs, for its prompt's rows); one vectorised sampling
call draws a token for each of them. The only device-to-host transfer is the
sampled ids (and log-probabilities when asked).

Greedy fast path: when every row is greedy and asks for no log-probabilities
(and the plan carries no ``SamplingContext``: no penalty, bias, ban or grammar), the draw is the argmax of each row, taken straight from the logits in their
own dtype (one fused pass on a CPU) instead of through the sampler's float32
copy. Widening bfloat16 to float32 is exact, so the tokens are the sampler's
bit for bit (``tests/step03_attention/test_fused_ops.py``).
"""

from __future__ import annotations

import torch

from paged.kernels.cpu import fused_ops
from paged.step02_block_table import KVCache
from paged.step03_attention.attention import AttentionMetadata, PagedAttention
from paged.step03_attention.plan import StepPlan
from paged.sampling.sampler import SampleResult, num_top_logprobs, prompt_logprob_entries, sample


class ModelRunner:
    """Runs plans against one model and its paged KV cache.

    Args:
        model: a ``paged.models`` causal LM.
        kv_cache: the paged cache, sized by the engine.
        backend: attention path name (``backends.resolve_backend``).
        batch_invariant: a token's result must not depend on the batch it is in: the backend's kernels
            reduce over absolute positions (``AttentionMetadata``) and the model's linears multiply a
            lone row as two or run the fixed-order kernel (``CausalLM.prepare_for_serving``; what it
            chose is ``self.serving``).
    """

    def __init__(self, model: torch.nn.Module, kv_cache: KVCache, backend: str,
                 batch_invariant: bool = False) -> None:
        self.model, self.kv_cache, self.backend = model, kv_cache, backend
        self.batch_invariant = batch_invariant
        self.serving = model.prepare_for_serving(batch_invariant)  # the linears' paths: packing, kernels, padding
        self.device = kv_cache.data.device
        self._generators: dict[int, torch.Generator] = {}
        # seq id -> {position: prompt logprob entry}, gathered chunk by chunk until the sequence samples
        self._prompt_logprobs: dict[int, dict[int, dict[int, float]]] = {}

    # --8<-- [start:execute]
    def execute(self, plan: StepPlan) -> dict[int, SampleResult]:
        """Run one iteration; returns the token drawn by each sequence that samples."""
        self.execute_memory_ops(plan)
        for seq_id in plan.finished_seq_ids:
            self._generators.pop(seq_id, None)
            self._prompt_logprobs.pop(seq_id, None)
        if not plan.seq_ids:
            return {}
        input_ids, positions, meta = self._inputs(plan)
        with torch.inference_mode():
            hidden = self.model(input_ids, positions, PagedAttention(self.kv_cache, meta, self.backend))
            rows = self._sample_rows(plan)  # (seq_id, token row, params, seed)
            spans = self._prompt_logprob_spans(plan) if plan.contexts else []
            if not rows and not spans:
                return {}
            extra = [t for _, first, n, _ in spans for t in range(first, first + n)]
            idx = [r[1] for r in rows] + extra
            logits = self.model.compute_logits(hidden[torch.tensor(idx, device=self.device)])  # [S' (+ prompt rows), V]
            return self._draw(logits[: len(rows) + len(extra)], rows, plan)
    # --8<-- [end:execute]

    def _inputs(self, plan: StepPlan) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata]:
        """The plan's token ids, positions and attention metadata as tensors."""
        meta = AttentionMetadata.build(plan.slot_mapping, plan.block_tables, plan.context_lens, plan.query_lens,
                                       self.device, batch_invariant=self.batch_invariant)
        return (torch.tensor(plan.input_ids, dtype=torch.int64, device=self.device),
                torch.tensor(plan.positions, dtype=torch.int64, device=self.device), meta)

    def _draw(self, logits: torch.Tensor, rows: list, plan: StepPlan) -> dict[int, SampleResult]:
        """One vectorised sampling call over the rows' logits ``[S', V]``, then any prompt logprobs
        in the rows after them (under tensor parallelism, only rank 0 draws)."""
        if not plan.contexts and all(p.greedy and num_top_logprobs(p) is None for _, _, p, _ in rows):
            tokens = greedy_tokens(logits).tolist()
            return {r[0]: SampleResult(t) for r, t in zip(rows, tokens)}
        contexts = [plan.contexts.get(r[0]) for r in rows] if plan.contexts else None
        results = self._sample(logits[:len(rows)], rows, contexts) if rows else []
        out = {r[0]: res for r, res in zip(rows, results)}
        if plan.contexts:
            self._gather_prompt_logprobs(logits[len(rows):], plan, out)
        return out

    def _sample(self, logits: torch.Tensor, rows: list, contexts) -> list[SampleResult]:
        """``sample`` over all rows; should it raise, each row alone, so that a row that fails
        gets its error (``SampleResult.error``) and the others their tokens. (Rows redrawn
        alone after a failed batch draw on from their generators' state: that path is for a
        failure nobody expected, and it keeps the server up rather than the draws identical.)"""
        params = [r[2] for r in rows]
        gens = [self._generator(r[0], r[3]) for r in rows]
        try:
            return sample(logits, params, gens, contexts)
        except Exception:
            results = []
            for i in range(len(rows)):
                try:
                    results += sample(logits[i:i + 1], params[i:i + 1], gens[i:i + 1],
                                      contexts[i:i + 1] if contexts else None)
                except Exception as e:
                    results.append(SampleResult(0, error=e))
            return results

    def _prompt_logprob_spans(self, plan: StepPlan) -> list[tuple[int, int, int, int]]:
        """``(seq_id, first token row, rows, first position)`` of each chunk whose logits give prompt
        logprobs: the positions whose next token is still a prompt token."""
        spans, start = [], 0
        for s, q_len in enumerate(plan.query_lens):
            ctx = plan.contexts.get(plan.seq_ids[s])
            if ctx is not None and ctx.prompt_logprobs:
                pos = plan.positions[start]
                n = min(q_len, len(ctx.prompt_token_ids) - 1 - pos)
                if n > 0:
                    spans.append((plan.seq_ids[s], start, n, pos))
            start += q_len
        return spans

    def _gather_prompt_logprobs(self, logits: torch.Tensor, plan: StepPlan, results: dict) -> None:
        """Keep each chunk's prompt logprobs; hand the whole list over with the sequence's first draw."""
        row = 0
        for seq_id, _, n, pos in self._prompt_logprob_spans(plan):
            ctx = plan.contexts[seq_id]
            k = plan.sampling_params[plan.seq_ids.index(seq_id)].prompt_logprobs
            entries = prompt_logprob_entries(logits[row:row + n], ctx.prompt_token_ids[pos + 1:pos + 1 + n], k)
            self._prompt_logprobs.setdefault(seq_id, {}).update(zip(range(pos, pos + n), entries))
            row += n
        for seq_id, res in results.items():
            ctx = plan.contexts.get(seq_id)
            if ctx is not None and ctx.prompt_logprobs:
                got = self._prompt_logprobs.pop(seq_id, {})
                res.prompt_logprobs = [None] + [got[p] for p in range(len(ctx.prompt_token_ids) - 1)]

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
