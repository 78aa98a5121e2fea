"""The decoding component of step04: a request is a group of sequences (paper §4.4).

Step03's scheduler loop asks its decoding component what a group's draws do
to it (``policies.OneSequence``: one sequence, each token recorded). Step04's
``SequenceGroups`` answers for groups that share blocks:

* **Parallel sampling** (``n``, ``best_of``): the prompt is computed once by
  the first sequence; when its last token has a slot (``after_slots``) the
  others are forked from it, mapping the same blocks, and each draws its
  first token from the same row of logits (the plan's ``fanout``). Sample
  ``i`` draws from its own generator, seeded by ``sample_seed(request seed,
  i)``, so it equals an independent ``n=1`` run with that seed. A sample that
  finishes gives its blocks back at once, before its siblings end.
* **Beam search** (``use_beam_search``, width ``best_of``; the rules in
  ``beam.py``): every step each live beam proposes its best tokens; a beam
  chosen more than once forks (its blocks shared, copy-on-write later), a
  beam nobody chose is dropped and its blocks freed at once.

The decisions are this component's; the mechanisms it uses are the
scheduler's (``new_seq``, ``release``) and the KV manager's (``fork``,
``free``), so the blocks keep one owner.

Extends: ``paged.step03_attention.policies.OneSequence``.
"""

from __future__ import annotations

from paged.step02_block_table import Sequence
from paged.step03_attention.policies import OneSequence
from paged.step04_sharing import beam
from paged.step04_sharing.request import GroupRequest


def sample_seed(seed: int, index: int) -> int:
    """The generator seed of parallel sample ``index`` of a request seeded with ``seed``."""
    return seed if index == 0 else (seed + index * 0x9E3779B97F4A7C15) % 2**63


class SequenceGroups(OneSequence):
    """Decoding for groups: parallel samples (``n``, ``best_of``) and beam search."""

    def new_request(self, *args) -> GroupRequest:
        return GroupRequest(*args)

    # --8<-- [start:fan_out]
    def after_slots(self, scheduler, req: GroupRequest, plan) -> None:
        """A parallel-sampling prompt whose last token has its slot in ``plan`` forks its samples:
        they map its blocks and sample its first row of logits (``plan.fanout``)."""
        p, seqs = req.params, req.seqs
        if (p.best_of > 1 and not p.use_beam_search and len(seqs) == 1 and not seqs[0].output_token_ids
                and seqs[0].block_table.num_tokens == seqs[0].num_tokens):
            parent = seqs[0]
            for i in range(1, p.best_of):
                child = self._fork(scheduler, req, parent, index=i)
                plan.fanout.append((parent.seq_id, child.seq_id, sample_seed(req.seed, i)))
    # --8<-- [end:fan_out]

    def process(self, scheduler, req: GroupRequest, results: dict) -> bool:
        if not req.params.use_beam_search:
            drew = super().process(scheduler, req, results)
            for seq in req.seqs:  # a finished sample gives its blocks back before its siblings end
                if seq.is_finished and seq.block_table.blocks:
                    scheduler.kv.free(seq)
            return drew
        live = [s for s in req.seqs if s.seq_id in results]
        if not live:
            return False
        self._beam_step(scheduler, req, live, results)
        return True

    def end_early(self, scheduler, req: GroupRequest) -> None:
        """A beam search ended early keeps its live beams, as they stand, as its answers."""
        if req.params.use_beam_search and not req.beam_done:
            self._keep_live_beams(scheduler, req)
            req.beam_done = True

    # -- beams ---------------------------------------------------------------------------
    def _beam_step(self, scheduler, req: GroupRequest, live: list[Sequence], results: dict) -> None:
        p, k, stops, outs = req.params, req.params.best_of, scheduler.stops, req.outputs
        ends = lambda t: (t in stops.eos and not p.ignore_eos) or t in p.stop_token_ids  # noqa: E731
        beams = [(outs[s.seq_id].cumulative_logprob or 0.0, list(s.output_token_ids)) for s in live]
        proposals = [results[s.seq_id].top_logprobs for s in live]  # >= 2k: more if logprobs asks more
        best_2k = [dict(sorted(prop.items(), key=lambda e: (-e[1], e[0]))[:2 * k]) for prop in proposals]
        chosen, done = beam.select(beams, best_2k, k, ends)
        for h in done:
            h.text = stops.decode(h.token_ids)
            h.stop_reason = h.ended_by if h.ended_by not in stops.eos else None
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
            forks = [self._fork(scheduler, req, seq, index=0) for _ in picks[1:]]
            for s, (tok, score) in zip([seq] + forks, picks):
                s.append_token(tok)
                outs[s.seq_id].token_ids.append(tok)
                outs[s.seq_id].cumulative_logprob = score
                outs[s.seq_id].logprobs = list(logprobs) if logprobs is not None else None
                next_seqs.append(s)
        for seq in live:
            if seq not in next_seqs:
                self._drop(scheduler, req, seq)
        # --8<-- [end:beam_update]
        length = len(next_seqs[0].output_token_ids) if next_seqs else 0
        best_live = max((outs[s.seq_id].cumulative_logprob for s in next_seqs), default=None)
        max_len = min(p.max_tokens, stops.max_model_len - len(req.prompt_token_ids))
        if beam.is_done(req.finished_beams, best_live, length, k, max_len, p.length_penalty, p.early_stopping):
            if length >= max_len:
                self._keep_live_beams(scheduler, req)
            for s in list(req.seqs):
                s.finish("stop")
            req.beam_done = True

    @staticmethod
    def _beam_logprobs(req: GroupRequest, parent: Sequence, proposal) -> list[dict[int, float]] | None:
        """The parent's logprobs and this step's entry (its proposals: the chosen token is among
        them), when the request asked for logprobs; the answer ranks the top ones."""
        if req.params.logprobs is None:
            return None
        return list(req.outputs[parent.seq_id].logprobs or []) + [dict(proposal)]

    @staticmethod
    def _keep_live_beams(scheduler, req: GroupRequest) -> None:
        """Every live beam, as it stands, joins the finished hypotheses (cut by length)."""
        for s in req.seqs:
            if not s.is_finished:
                out = req.outputs[s.seq_id]
                h = beam.Hypothesis(list(s.output_token_ids), out.cumulative_logprob or 0.0, None,
                                    logprobs=out.logprobs)
                h.text = scheduler.stops.decode(h.token_ids)
                req.finished_beams.append(h)

    # -- forks and drops, through the scheduler and the KV manager ---------------------------
    @staticmethod
    def _fork(scheduler, req: GroupRequest, parent: Sequence, index: int) -> Sequence:
        """A new sequence of ``req`` continuing ``parent``: its blocks shared, its tokens and output copied."""
        child = scheduler.new_seq(req, parent.prompt_token_ids, index, scheduler.kv.fork(parent))
        child.output_token_ids = list(parent.output_token_ids)
        child.status = parent.status
        src, out = req.outputs[parent.seq_id], req.outputs[child.seq_id]
        out.token_ids, out.cumulative_logprob = list(src.token_ids), src.cumulative_logprob
        return child

    @staticmethod
    def _drop(scheduler, req: GroupRequest, seq: Sequence) -> None:
        """A beam nobody chose: its blocks are freed now, and it leaves the request."""
        seq.finish("dropped")
        scheduler.release(req, seq)
        req.seqs.remove(seq)
        del req.outputs[seq.seq_id]
