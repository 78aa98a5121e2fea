"""Chunked prefill: a prompt longer than the token budget is computed over several iterations.

One rule drives prefill, chunked prefill, decode and recompute alike: a
sequence has ``num_tokens - block_table.num_tokens`` pending tokens (those
without K/V yet); this iteration computes up to the token budget of them, and
the sequence samples only when none remain. The scheduler's loop serves the
decodes before the prompt chunks, so running sequences keep decoding in the
iterations that prefill a long prompt. A group of several sequences is
computed whole in one iteration, so beams stay in lockstep.

``ChunkedPrefill`` is the chunking component of step05's scheduler (step03's
is ``policies.WholePrompt``).
"""

from __future__ import annotations

from paged.step03_attention.policies import Budget
from paged.step05_preemption.iteration_cost import IterationCost, plan_work, prefill_work


# --8<-- [start:fit]
class ChunkedPrefill:
    """Chunking, step05: a lone sequence takes what the token budget leaves, a long prompt at most
    ``long_prefill_token_threshold`` tokens an iteration, and with a ``cost`` at most the tokens it
    can compute in what the iteration's prompt chunks have left of the target seconds; a group runs
    whole.

    Args:
        long_prefill_token_threshold: the most prompt tokens (a chunk of a prompt or of a
            recomputation) one sequence computes in an iteration, so that an iteration stays short
            and a request arriving during a long prefill starts within one; 0: no cap but the budget.
        cost: an ``IterationCost`` (``iteration_cost.py``), learning what an iteration costs from
            ``observe``; None: chunks are capped in tokens only.
    """

    splits_prompts = True  # any prompt fits: it is prefilled in chunks of the token budget

    def __init__(self, long_prefill_token_threshold: int = 0, cost: IterationCost | None = None) -> None:
        if isinstance(long_prefill_token_threshold, bool) or not isinstance(long_prefill_token_threshold, int) \
                or long_prefill_token_threshold < 0:
            raise ValueError(f"long_prefill_token_threshold must be an int >= 0 (0: no cap), "
                             f"got {long_prefill_token_threshold!r}")
        self.long_prefill_token_threshold, self.cost = long_prefill_token_threshold, cost

    def fit(self, req, budget: Budget, plan) -> list | None:
        """A lone sequence takes what the token budget leaves (a long prompt is prefilled in chunks,
        while the others keep decoding); a group of several runs whole, so beams stay in lockstep
        — over the budget only when it would otherwise never run (the plan is still empty)."""
        live = req.live_seqs
        if not live or len(live) > budget.seqs:
            return None
        counts = [s.num_pending for s in live]
        if len(live) == 1:
            n = min(counts[0], budget.tokens)
            if counts[0] > 1:  # a prompt chunk: capped in tokens, then to what fits in the seconds left
                if self.long_prefill_token_threshold:
                    n = min(n, self.long_prefill_token_threshold)
                if self.cost is not None and n > 0:
                    n = self.cost.most_tokens(live[0].block_table.num_tokens, n, beside=prefill_work(plan))
            return [(live[0], n)] if n > 0 else None
        if sum(counts) > budget.tokens and plan.seq_ids:
            return None
        return list(zip(live, counts))
# --8<-- [end:fit]

    def observe(self, plan, seconds: float) -> None:
        """The engine's report of an iteration: its plan and how long it took (teaches ``cost``)."""
        if self.cost is not None:
            self.cost.observe(*plan_work(plan.query_lens, plan.context_lens), seconds)
