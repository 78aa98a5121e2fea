"""The scheduler of step04: sequence groups over shared blocks (paper §4.4).

``SharingScheduler`` is step03's ``Scheduler`` over a ``BlockManager``: its
tables fork and copy on write, and a new prompt maps its cached blocks first.
It overrides the hooks of that idea and nothing else:

* ``_blocks_needed`` / ``_take_slots`` — a sequence with no K/V yet (a new
  prompt, a recomputation) maps the cached blocks of its prompt first;
* ``_give_slots`` — a finished prompt forks its parallel samples, and every
  copy-on-write a table queued goes into the plan's ``blocks_to_copy``;
* ``_process`` / ``_end`` — beam search (``beam.py``): surviving candidates
  fork, dropped ones are freed; full blocks get their prefix-cache names once
  their K/V is written;
* ``new_seq`` — tables come from the block manager (and requests are
  ``GroupRequest``s, ``request.py``).

Each parallel sample draws from its own generator, seeded by
``sample_seed(request seed, i)``, so sample ``i`` equals an independent
``n=1`` run with that seed.

Extends: ``paged.step03_attention.scheduler.Scheduler``.
"""

from __future__ import annotations

from paged.step02_block_table import Sequence
from paged.step03_attention.scheduler import Scheduler
from paged.step04_sharing import beam
from paged.step04_sharing.block_manager import BlockManager
from paged.step04_sharing.request import GroupRequest
from paged.step04_sharing.plan import SharingStepPlan


def sample_seed(seed: int, index: int) -> int:
    """The generator seed of parallel sample ``index`` of a request seeded with ``seed``."""
    return seed if index == 0 else (seed + index * 0x9E3779B97F4A7C15) % 2**63


class SharingScheduler(Scheduler):
    """``Scheduler`` whose pool is a ``BlockManager``: forks, copy-on-write, beams, prefix caching.

    Args:
        enable_prefix_caching: reuse cached full prompt blocks (default on).
        **kwargs (object): as ``paged.step03_attention.scheduler.Scheduler``.
    """

    def __init__(self, num_blocks: int, block_size: int, *, enable_prefix_caching: bool = True, **kwargs) -> None:
        self.enable_prefix_caching = enable_prefix_caching
        super().__init__(num_blocks, block_size, **kwargs)

    def _make_allocator(self, num_blocks, free_order):
        self.block_manager = BlockManager(num_blocks, self.block_size, self.enable_prefix_caching, free_order)
        return self.block_manager.allocator

    def _new_request(self, *args) -> GroupRequest:
        req = GroupRequest(*args)
        req.finished_beams = []
        req._eos = self.stops.eos
        return req

    def new_seq(self, req, token_ids, index, table=None):
        # a request that wants prompt logprobs computes its whole prompt: cached blocks have no logits
        table = table or self.block_manager.new_table(reuse_cached=req.params.prompt_logprobs is None)
        return super().new_seq(req, token_ids, index, table)

    # -- the hooks: prefix lookups, forks, copy-on-write ----------------------------
    def _blocks_needed(self, work) -> int:
        """As step03, but a sequence with no K/V yet (a new prompt or a recomputation) maps its
        cached prompt blocks first: a hit on a block in use takes no free block."""
        need = 0
        for seq, n in work:
            table = seq.block_table
            if table.num_tokens == 0:
                need += self.block_manager.blocks_needed_for_prompt(seq.token_ids, n, table.reuse_cached)
            else:
                need += table.slots_for(n)
        return need

    # --8<-- [start:take_slots]
    def _take_slots(self, req, seq, n):
        """A sequence with no K/V yet maps the cached blocks of its prompt, then gets slots for the rest."""
        table = seq.block_table
        if table.num_tokens > 0:
            return super()._take_slots(req, seq, n)
        cached, slots = self.block_manager.allocate_prompt(table, seq.token_ids, n)
        if not req.prompt_mapped:  # the prompt's first computation, not a recomputation (even one
            req.num_cached_tokens, req.prompt_mapped = cached, True  # preempted before its first token)
        return cached, slots, cached
    # --8<-- [end:take_slots]

    # --8<-- [start:give_slots]
    def _give_slots(self, plan, req, work, budget) -> None:
        """As step03; then a finished prompt forks its parallel samples (they map its blocks), and
        every copy-on-write a table queued goes into the plan's ``blocks_to_copy``."""
        super()._give_slots(plan, req, work, budget)
        if self._fans_out(req):
            parent = req.seqs[0]
            for i in range(1, req.params.best_of):
                child = self._fork(req, parent, index=i)
                plan.fanout.append((parent.seq_id, child.seq_id, sample_seed(req.seed, i)))
        for seq in req.seqs:
            for src, dst in seq.block_table.take_copies():
                plan.blocks_to_copy.append((src, dst))
                self._record("cow", req, seq, src=src, dst=dst)
    # --8<-- [end:give_slots]

    def _fans_out(self, req) -> bool:
        """A parallel-sampling request whose prompt completes in this plan, its samples not yet forked."""
        p, seqs = req.params, req.seqs
        return (p.best_of > 1 and not p.use_beam_search and len(seqs) == 1 and not seqs[0].output_token_ids
                and seqs[0].block_table.num_tokens == seqs[0].num_tokens)

    def _end(self, req, reason) -> None:
        """As step03; a beam search ended early keeps its live beams, as they stand, as its answers."""
        if req.params.use_beam_search and not req.beam_done:
            self._keep_live_beams(req)
            req.beam_done = True
        super()._end(req, reason)

    def _empty_plan(self):
        return SharingStepPlan()

    def _fork(self, req, parent: Sequence, index: int) -> Sequence:
        child = self.new_seq(req, parent.prompt_token_ids, index, self.block_manager.fork(parent.block_table))
        child.output_token_ids = list(parent.output_token_ids)
        child.status = parent.status
        src = req.outputs[parent.seq_id]
        out = req.outputs[child.seq_id]
        out.token_ids, out.cumulative_logprob = list(src.token_ids), src.cumulative_logprob
        return child

    # -- after the forward pass -----------------------------------------------
    def _process(self, req, results) -> bool:
        for seq in req.seqs:  # K/V of every token up to num_tokens is now written
            if self.block_manager.has_unnamed_full_blocks(seq.block_table):
                self.block_manager.register_full_blocks(seq.block_table, seq.token_ids)
        if not req.params.use_beam_search:
            drew = super()._process(req, results)
            for seq in req.seqs:  # a finished sample gives its blocks back before its siblings end
                if seq.is_finished and seq.block_table.blocks:
                    self.block_manager.free(seq.block_table)
            return drew
        live = [s for s in req.seqs if s.seq_id in results]
        if not live:
            return False
        self._beam_step(req, live, results)
        return True

    def _beam_step(self, req, live, results) -> None:
        p, k = req.params, req.params.best_of
        outs = req.outputs
        ends = lambda t: (t in self.stops.eos and not p.ignore_eos) or t in p.stop_token_ids  # noqa: E731
        beams = [(outs[s.seq_id].cumulative_logprob or 0.0, list(s.output_token_ids)) for s in live]
        proposals = [results[s.seq_id].top_logprobs for s in live]  # >= 2k: more if logprobs asks more
        best_2k = [dict(sorted(prop.items(), key=lambda e: (-e[1], e[0]))[:2 * k]) for prop in proposals]
        chosen, done = beam.select(beams, best_2k, k, ends)
        for h in done:
            h.text = self.stops.decode(h.token_ids)
            h.logprobs = self._beam_logprobs(req, live[h.parent], proposals[h.parent])
        req.finished_beams += done
        # --8<-- [start:beam_update]
        # the next beams: the first pick of a parent extends it, later picks fork it first
        by_parent: dict[int, list[tuple[int, float]]] = {}
        for b, tok, score in chosen:
            by_parent.setdefault(b, []).append((tok, score))
        next_seqs = []
        for b, seq in enumerate(live):
            picks = by_parent.get(b)
            if not picks:
                continue
            logprobs = self._beam_logprobs(req, seq, proposals[b])
            forks = [self._fork(req, seq, index=0) for _ in picks[1:]]
            for s, (tok, score) in zip([seq] + forks, picks):
                s.append_token(tok)
                outs[s.seq_id].token_ids.append(tok)
                outs[s.seq_id].cumulative_logprob = score
                outs[s.seq_id].logprobs = list(logprobs) if logprobs is not None else None
                next_seqs.append(s)
        for seq in live:
            if seq not in next_seqs:
                self._drop(req, seq)
        # --8<-- [end:beam_update]
        length = len(next_seqs[0].output_token_ids) if next_seqs else 0
        best_live = max((outs[s.seq_id].cumulative_logprob for s in next_seqs), default=None)
        max_len = min(p.max_tokens, self.stops.max_model_len - len(req.prompt_token_ids))
        if beam.is_done(req.finished_beams, best_live, length, k, max_len, p.length_penalty, p.early_stopping):
            if length >= max_len:
                self._keep_live_beams(req)
            for s in list(req.seqs):
                s.finish("stop")
            req.beam_done = True

    def _beam_logprobs(self, req, parent, proposal) -> list[dict[int, float]] | None:
        """The parent's logprobs and this step's entry (its proposals: the chosen token is among
        them), when the request asked for logprobs; the answer ranks the top ones."""
        if req.params.logprobs is None:
            return None
        return list(req.outputs[parent.seq_id].logprobs or []) + [dict(proposal)]

    def _keep_live_beams(self, req) -> None:
        """Every live beam, as it stands, joins the finished hypotheses (cut by length)."""
        for s in req.seqs:
            if not s.is_finished:
                out = req.outputs[s.seq_id]
                h = beam.Hypothesis(list(s.output_token_ids), out.cumulative_logprob or 0.0, None,
                                    logprobs=out.logprobs)
                h.text = self.stops.decode(h.token_ids)
                req.finished_beams.append(h)

    def _drop(self, req, seq) -> None:
        """A beam nobody chose: free its blocks now; it leaves the request."""
        seq.finish("dropped")
        self._record("finished", req, seq, reason="dropped")
        self.block_manager.free(seq.block_table)
        self._finished_seq_ids.append(seq.seq_id)
        req.seqs.remove(seq)
        del req.outputs[seq.seq_id]
