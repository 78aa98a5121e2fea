"""A request of step04: a group of sequences that may fork, finish at different times, or be ranked.

Parallel samples (``n``, ``best_of > n``: the ``n`` with the highest cumulative
log-probability are returned) and beams (``beam.py``) are sequences of one
request; the request is finished when all its samples are, or when its beam
search is done. The beam search's own state — the finished hypotheses and
whether it is over — is declared here and kept by the decoding component
(``decoding.SequenceGroups``).

Extends: ``paged.step03_attention.request.Request``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from paged.step03_attention.outputs import CompletionOutput, RequestOutput
from paged.step03_attention.request import Request
from paged.step04_sharing import beam


@dataclass(eq=False)
class GroupRequest(Request):
    """A request whose sequences may fork, finish at different times, or be ranked."""

    finished_beams: list[beam.Hypothesis] = field(default_factory=list)  # beam search: ended hypotheses
    beam_done: bool = False  # beam search: no further step can change the answers

    @property
    def finished(self) -> bool:
        if self.params.use_beam_search:
            return self.beam_done
        return all(s.is_finished for s in self.seqs)

    def to_output(self) -> RequestOutput:
        p = self.params
        if p.use_beam_search:
            outs = self._beam_outputs() if self.beam_done else [self.outputs[s.seq_id] for s in self.seqs]
        else:
            outs = [self.outputs[s.seq_id] for s in self.seqs]
            if p.best_of > p.n and self.finished:
                outs = sorted(outs, key=lambda o: -(o.cumulative_logprob or 0.0))[: p.n]
                outs = [CompletionOutput(i, o.text, o.token_ids, o.cumulative_logprob, o.logprobs,
                                         o.finish_reason, o.stop_reason) for i, o in enumerate(outs)]
        return RequestOutput(self.request_id, self.prompt, self.prompt_token_ids, outs,
                             self.finished, self.num_cached_tokens, self.prompt_logprobs, self.error)

    def _beam_outputs(self) -> list[CompletionOutput]:
        chosen = beam.best(self.finished_beams, self.params.n, self.params.length_penalty)
        return [CompletionOutput(i, h.text, h.token_ids, h.cumulative_logprob, h.logprobs,
                                 "stop" if h.ended_by is not None else "length", h.stop_reason)
                for i, h in enumerate(chosen)]
