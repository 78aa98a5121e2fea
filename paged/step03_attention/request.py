"""A request as the engine tracks it: its sequences, settings and stopping rules.

A request owns one sequence in step03; step04 gives it several (``n``, beam
search) that share blocks. Stopping is decided here, per sequence, from the
sampled token and the text so far (EOS, stop token ids, stop strings,
``max_tokens``, the model's context length).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from paged.step02_block_table import Sequence
from paged.step03_attention.outputs import CompletionOutput, RequestOutput
from paged.sampling.result import SampleResult
from paged.sampling.sampling_params import SamplingParams

REPLACEMENT = "\ufffd"  # what decoding yields for the bytes of a character not yet complete


@dataclass(eq=False)  # a request is itself: queue membership tests identity, not every field
class Request:
    """One ``add_request`` call.

    ``queue`` names the scheduler's queue that holds it (``"waiting"``, ``"running"``,
    ``"swapped"``), None once it has left them all: so leaving a queue costs one
    lookup, however long the others are.
    """

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    params: SamplingParams
    seed: int  # seeds the first sequence's generator
    arrival: int  # FCFS order
    client: str = ""  # who sent it (the server: the peer's address); an order component may rank by it
    priority: int = 0  # vLLM's: the smaller goes first, for an order that ranks by it (step05's PriorityFirst)
    seqs: list[Sequence] = field(default_factory=list)
    outputs: dict[int, CompletionOutput] = field(default_factory=dict)  # seq_id -> output
    sampling_state: object = None  # a SamplingState when its params process logits (made by the engine)
    error: BaseException | None = None  # what ended it, when its own processing failed (Scheduler.fail)
    queue: str | None = None  # the scheduler's queue that holds it
    num_cached_tokens: int = 0  # prompt tokens its first computation found in the prefix cache (step04)
    prompt_mapped: bool = False  # that first computation has begun (a recomputation keeps the count)

    @property
    def prompt_logprobs(self) -> list | None:
        return self.sampling_state.prompt_logprobs if self.sampling_state is not None else None

    @property
    def finished(self) -> bool:
        return all(s.is_finished for s in self.seqs)

    @property
    def live_seqs(self) -> list[Sequence]:
        """Its sequences still generating."""
        return [s for s in self.seqs if not s.is_finished]

    def to_output(self) -> RequestOutput:
        completions = [self.outputs[s.seq_id] for s in self.seqs]
        return RequestOutput(
            self.request_id, self.prompt, self.prompt_token_ids, completions, self.finished,
            self.num_cached_tokens, prompt_logprobs=self.prompt_logprobs, error=self.error,
        )


class StopChecker:
    """Decides after each sampled token whether a sequence is done.

    Args:
        eos_token_ids (list[int]): the model's end-of-sequence ids.
        max_model_len: the most tokens (prompt + output) a sequence may hold.
        tokenizer (tokenizers.Tokenizer | None): a ``tokenizers.Tokenizer`` to detokenize with, or None.
    """

    def __init__(self, eos_token_ids, max_model_len: int, tokenizer=None) -> None:
        self.eos = set(eos_token_ids or [])
        self.max_model_len = max_model_len
        self.tokenizer = tokenizer

    def decode(self, token_ids: list[int]) -> str:
        return self.tokenizer.decode(token_ids, skip_special_tokens=True) if self.tokenizer else ""

    def record(self, seq: Sequence, out: CompletionOutput, result: SampleResult, params: SamplingParams):
        """Append the token to ``seq`` and ``out``; finish ``seq`` if a rule says so."""
        token = result.token_id
        seq.append_token(token)
        out.token_ids.append(token)
        if result.logprob is not None:
            out.cumulative_logprob = (out.cumulative_logprob or 0.0) + result.logprob
            entry = dict(result.top_logprobs or {})
            entry[token] = result.logprob
            if out.logprobs is None:
                out.logprobs = []
            out.logprobs.append(entry)
        n_out = len(seq.output_token_ids)
        reason, stop_reason = None, None
        if n_out > params.min_tokens or n_out == params.max_tokens:
            if token in self.eos and not params.ignore_eos:
                reason = "stop"
            elif token in params.stop_token_ids:
                reason, stop_reason = "stop", token
        if reason is None and params.stop and self.tokenizer is not None and n_out > params.min_tokens:
            # Only the newest token can complete a stop string, so look at a tail
            # long enough to hold the longest one (a character takes at most 4
            # byte-level tokens); decode everything only on a hit.
            window = 4 * max(len(s) for s in params.stop) + 4
            tail = self.decode(seq.output_token_ids[-window:])
            if any(s in tail for s in params.stop):
                # a character whose bytes are not all generated yet decodes as U+FFFD: the text is
                # matched only as far as it is decoded for good (its trailing U+FFFD held back)
                text = self.decode(seq.output_token_ids)
                decoded = text.rstrip(REPLACEMENT)
                hits = [(decoded.find(s), s) for s in params.stop if s in decoded]
                if hits:  # (a tail cut inside a character can show a match the text does not have)
                    at, hit = min(hits)
                    reason, stop_reason, out.text = "stop", hit, text[:at]
        if reason is None and (n_out >= params.max_tokens or seq.num_tokens >= self.max_model_len):
            reason = "length"
        if reason is not None:
            self.finish(seq, out, reason, stop_reason)

    def finish(self, seq: Sequence, out: CompletionOutput, reason: str, stop_reason=None) -> None:
        seq.finish(reason)
        out.finish_reason, out.stop_reason = reason, stop_reason
        if not (reason == "stop" and isinstance(stop_reason, str)):
            out.text = self.decode(out.token_ids)
