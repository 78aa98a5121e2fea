"""The engine's side of logit processing: per-request history, bad words, grammars, prompt logprobs.

The runner samples from plain data, so everything a penalty, a ban or a
grammar needs is gathered here, on the scheduler's side, once per iteration:
``SamplingStates.attach`` (called by the scheduler as it finishes a plan)
puts one ``SamplingContext`` into the plan for every live sequence of every
running request whose ``SamplingParams.processes_logits``. Requests without
such options cost one attribute read each; a plan without contexts is the
plain path.

Prompt log-probabilities come back with the first token a request draws
(``SampleResult.prompt_logprobs``); ``SamplingStates.collect`` keeps them
on the request, which asks for them only until it has them, so a request
recomputed after preemption does not compute them twice.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from paged.errors import RequestError
from paged.sampling.logits_processors import SamplingContext
from paged.sampling.sampling_params import SamplingParams
from paged.sampling.structured import GrammarCompiler, GrammarMatcher

if TYPE_CHECKING:
    from tokenizers import Tokenizer


def check_against_model(params: SamplingParams, vocab_size: int, tokenizer, grammars) -> None:
    """What ``SamplingParams`` cannot check alone: token ids in the vocabulary, a tokenizer when
    needed, and a grammar that compiles against this tokenizer (``grammars()``: the engine's
    ``GrammarCompiler``), so that nothing fails once the request runs."""
    for name, ids, what in (("logit_bias", params.logit_bias or {}, "logit_bias token ids"),
                            ("allowed_token_ids", params.allowed_token_ids or (), "allowed_token_ids"),
                            ("stop_token_ids", params.stop_token_ids, "stop_token_ids")):
        outside = [t for t in ids if t >= vocab_size]
        if outside:
            raise RequestError(f"{what} must be in [0, {vocab_size}) (the model's vocabulary), got {outside[:5]}",
                               param=name, bound=(0, vocab_size))
    for name in ("bad_words", "guided_decoding"):
        if getattr(params, name) and tokenizer is None:
            raise RequestError(f"{name} needs the model's tokenizer (tokenizer.json), and this model has none",
                               param=name)
    if params.guided_decoding is not None:
        grammars().matcher(params.guided_decoding)


def bad_word_token_ids(words: list[str], tokenizer) -> dict[tuple[int, ...], set[int]]:
    """Each bad word as the model writes it, alone and after a space (both spellings are banned),
    as ``{tokens before the last: {last tokens}}``: built in one pass over the words, and
    looked up in ``SamplingState.context`` once per distinct prefix length, not once per word."""
    spellings = [s for word in words for s in (word, " " + word.lstrip())]
    bans: dict[tuple[int, ...], set[int]] = {}
    for enc in tokenizer.encode_batch(spellings, add_special_tokens=False):
        if enc.ids:
            bans.setdefault(tuple(enc.ids[:-1]), set()).add(enc.ids[-1])
    return bans


class SamplingState:
    """One request's logit-processing state, kept by the engine while the request lives.

    Args:
        params: the request's ``SamplingParams``.
        eos_token_ids: the model's end-of-sequence ids (banned before ``min_tokens``).
        tokenizer: the model's tokenizer (bad words), or None.
        compiler: a ``GrammarCompiler`` when the request has a grammar, else None.
    """

    def __init__(self, params: SamplingParams, eos_token_ids: Iterable[int], tokenizer: Tokenizer | None,
                 compiler: GrammarCompiler | None) -> None:
        self.params = params
        self.stop_ids = sorted(set(params.stop_token_ids) | (set() if params.ignore_eos else set(eos_token_ids)))
        self.bad_words = bad_word_token_ids(params.bad_words, tokenizer) if params.bad_words else {}
        self.bad_word_prefix_lens = sorted({len(prefix) for prefix in self.bad_words})
        self.compiler = compiler
        self.matchers: dict[int, GrammarMatcher] = {}  # seq id -> its position in the grammar
        self.prompt_logprobs: list | None = None  # once computed

    # --8<-- [start:context]
    def context(self, seq, computes_prompt: bool) -> SamplingContext:
        """The sampler's view of ``seq`` for this iteration (its grammar brought up to date first)."""
        p, out = self.params, seq.output_token_ids
        ctx = SamplingContext(output_token_ids=list(out))
        want_prompt_logprobs = computes_prompt and p.prompt_logprobs is not None and self.prompt_logprobs is None
        if p.repetition_penalty != 1.0 or want_prompt_logprobs:
            ctx.prompt_token_ids = seq.prompt_token_ids
        ctx.prompt_logprobs = want_prompt_logprobs
        if len(out) < p.min_tokens:
            ctx.banned_token_ids = list(self.stop_ids)
        for n in self.bad_word_prefix_lens:  # a word whose other tokens end the output: ban its last
            if n <= len(out):
                ctx.banned_token_ids.extend(self.bad_words.get(tuple(out[len(out) - n:]), ()))
        if p.guided_decoding is not None:
            matcher = self.matchers.get(seq.seq_id)
            if matcher is None:  # a new sequence (or a sample forked before its first token)
                matcher = self.matchers[seq.seq_id] = self.compiler.matcher(p.guided_decoding)
            matcher.sync(out)
            ctx.allowed_bitmask = matcher.bitmask()
        return ctx
    # --8<-- [end:context]


class SamplingStates:
    """Every request's ``SamplingState``, made when first needed, and the grammar compiler they share.

    The engine builds one per model and hands it to its scheduler, which calls
    ``attach`` on every plan it decides and ``collect`` on every update.

    Args:
        eos_token_ids: the model's end-of-sequence ids.
        tokenizer: the model's tokenizer, or None.
        vocab_size: the model's vocabulary size.
    """

    def __init__(self, eos_token_ids: Iterable[int], tokenizer: Tokenizer | None, vocab_size: int) -> None:
        self.eos_token_ids, self.tokenizer, self.vocab_size = list(eos_token_ids), tokenizer, vocab_size
        self._compiler: GrammarCompiler | None = None  # built with the first structured request

    def grammars(self) -> GrammarCompiler:
        """The grammar compiler for this model's tokenizer, built with the first structured request."""
        if self._compiler is None:
            self._compiler = GrammarCompiler(self.tokenizer, self.vocab_size, self.eos_token_ids)
        return self._compiler

    def check(self, params: SamplingParams) -> None:
        """``check_against_model`` for this model: raises ``RequestError`` before anything runs."""
        check_against_model(params, self.vocab_size, self.tokenizer, self.grammars)

    def state(self, req) -> SamplingState:
        """``req``'s penalties, bans and grammars state, made when first needed."""
        if req.sampling_state is None:
            compiler = self.grammars() if req.params.guided_decoding is not None else None
            req.sampling_state = SamplingState(req.params, self.eos_token_ids, self.tokenizer, compiler)
        return req.sampling_state

    def attach(self, plan, requests) -> dict[str, Exception]:
        """Put a ``SamplingContext`` for every live sequence of ``requests`` that process logits into ``plan``.

        A request's first sequence computes its prompt; parallel samples forked
        from it get their own contexts (and grammar matchers) from their first
        draw on. Returns ``{request id: exception}`` for the requests whose
        state failed (a grammar that met a limit): they get no context, and the
        scheduler ends them.
        """
        failed = {}
        for req in requests:
            if not req.params.processes_logits:
                continue
            try:
                state = self.state(req)
                contexts = {seq.seq_id: state.context(seq, computes_prompt=i == 0)
                            for i, seq in enumerate(req.seqs) if not seq.is_finished}
            except Exception as e:  # this request's own failure: it ends, the plan goes on without it
                failed[req.request_id] = e
                continue
            plan.contexts.update(contexts)
        return failed

    def collect(self, requests, results: dict) -> None:
        """Keep the prompt logprobs that came back with a request's first draw."""
        for req in requests:
            if req.params.prompt_logprobs is None:
                continue
            state = self.state(req)
            res = results.get(req.seqs[0].seq_id) if req.seqs else None
            if state.prompt_logprobs is None and res is not None and res.prompt_logprobs is not None:
                state.prompt_logprobs = res.prompt_logprobs
