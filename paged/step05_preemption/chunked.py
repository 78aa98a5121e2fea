"""Chunked prefill: a prompt longer than the token budget is computed over several iterations.

One rule drives prefill, chunked prefill, decode and recompute alike: a
sequence has ``num_tokens - block_table.num_tokens`` pending tokens (those
without K/V yet); this iteration computes up to the token budget of them, and
the sequence samples only when none remain — so running sequences keep
decoding in the iterations that prefill a long prompt. A group of several
sequences is computed whole in one iteration, so beams stay in lockstep.

Extends: ``paged.step04_sharing.SharingScheduler`` (its ``_fit_to_budget`` hook).
"""

from __future__ import annotations

from paged.step04_sharing.scheduler import SharingScheduler


class ChunkedPrefillScheduler(SharingScheduler):
    """``SharingScheduler`` that splits a lone sequence's pending tokens to fit the token budget."""

    chunked_prefill = True  # any prompt fits: it is prefilled in chunks of the token budget

    # --8<-- [start:fit_to_budget]
    def _fit_to_budget(self, req, budget, plan):
        """A lone sequence takes what the token budget leaves (a long prompt is prefilled in chunks,
        while the others keep decoding); a group of several runs whole, so beams stay in lockstep
        — over the budget only when it would otherwise never run (the plan is still empty)."""
        live = [s for s in req.seqs if not s.is_finished]
        if not live or len(live) > budget.seqs:
            return None
        pending = [s.num_tokens - s.block_table.num_tokens for s in live]
        if len(live) == 1:
            n = min(pending[0], budget.tokens)
            return [(live[0], n)] if n > 0 else None
        if sum(pending) > budget.tokens and plan.seq_ids:
            return None
        return list(zip(live, pending))
    # --8<-- [end:fit_to_budget]
