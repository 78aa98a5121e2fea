"""Beam search restated over whole candidates: the oracle of the beam tests, with a model or without.

``beam_search(propose, ...)`` follows the rules of ``paged/step04_sharing/beam.py``
with no blocks, forks or sequences: a candidate is its list of generated
tokens, and every step each live candidate asks ``propose(tokens)`` for its
proposals ``{token: logprob}`` afresh. The engine's answer must equal it.
``tests/step04_sharing/test_sharing_engine.py`` proposes from a model's logits
(contiguous KV, every candidate recomputed); ``tests/step04_sharing/test_scheduler_rules.py``
from ``HistoryStandIn`` below, model-free. Imports no torch.
"""

from __future__ import annotations

from paged.sampling.result import SampleResult, num_top_logprobs
from paged.step03_attention.stand_in import StandInRunner, mix
from paged.step04_sharing.beam import Hypothesis, best, is_done


def beam_search(propose, k: int, n: int, max_tokens: int, length_penalty: float, early_stopping,
                is_end) -> list[Hypothesis]:
    """The ``n`` best hypotheses, best first; each one's ``logprobs`` lists the proposals of every step.

    Args:
        propose: generated tokens so far (a list) -> ``{token: logprob}``, at least ``2k`` entries;
            the ``2k`` best of them (ties: lower token) compete.
        is_end: token -> True for an end of sequence (EOS, a stop token id).
    """
    beams, finished = [(0.0, [], [])], []  # live: (cumulative logprob, tokens, each step's proposals)
    while True:
        proposals = [propose(tokens) for _, tokens, _ in beams]
        ranked = sorted(((cum + lp, b, t) for b, (cum, _, _) in enumerate(beams)
                         for t, lp in sorted(proposals[b].items(), key=lambda e: (-e[1], e[0]))[:2 * k]),
                        key=lambda x: (-x[0], x[1], x[2]))
        new = []
        for score, b, t in ranked:
            if len(new) == k:
                break
            _, tokens, steps = beams[b]
            if is_end(t):
                finished.append(Hypothesis(tokens + [t], score, t, logprobs=steps + [proposals[b]]))
            else:
                new.append((score, tokens + [t], steps + [proposals[b]]))
        beams = new
        length = len(beams[0][1]) if beams else 0
        best_live = max((c for c, _, _ in beams), default=None)
        if is_done(finished, best_live, length, k, max_tokens, length_penalty, early_stopping):
            if length >= max_tokens:
                finished += [Hypothesis(t, c, None, logprobs=s) for c, t, s in beams]
            return best(finished, n, length_penalty)


def proposals_of(tokens, count: int, eos: int, vocab: int = 24) -> dict[int, float]:
    """``count`` distinct tokens of ``eos, 3 .. vocab - 1`` with decreasing log-probabilities, from a
    hash of ``tokens`` alone (the whole sequence: prompt and generated). A small vocabulary, so that
    beams propose the same tokens and EOS comes up now and then."""
    x, lp, tops = mix(len(tokens), *tokens), 0.0, {}
    while len(tops) < count:
        x = mix(x)
        tok = eos if x % vocab < 2 else 3 + x % (vocab - 3)
        if tok not in tops:
            lp -= 0.05 + (x >> 40) / 2**24  # gaps in (0.05, 1.05): no two scores tie
            tops[tok] = lp
    return tops


class HistoryStandIn(StandInRunner):
    """The stand-in runner, but a beam's proposals hash its tokens (``proposals_of``), not its seq id:
    the oracle, which knows candidates by their tokens only, then sees the same search tree.

    Args:
        scheduler: whose running groups hold the sequences the plans name.
        eos: the end-of-sequence id it proposes now and then.
        vocab: the proposals' vocabulary size (``proposals_of``; smaller: EOS more often).
    """

    def __init__(self, scheduler, eos: int, vocab: int = 24) -> None:
        super().__init__(eos=eos)
        self.scheduler, self.vocab = scheduler, vocab

    def draw(self, seq_id, seed, position, params) -> SampleResult:
        if not params.use_beam_search:
            return super().draw(seq_id, seed, position, params)
        seq = next(s for r in self.scheduler.running for s in r.seqs if s.seq_id == seq_id)
        tops = proposals_of(seq.token_ids, num_top_logprobs(params), self.eos, self.vocab)
        first = next(iter(tops))
        return SampleResult(first, tops[first], tops)
