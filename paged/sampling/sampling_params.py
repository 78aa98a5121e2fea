"""``SamplingParams``: how one request wants its tokens chosen (vLLM's API shape).

Validation happens here, at construction, so a bad request is refused before
it touches the engine: every error is a ``RequestError`` (a ``ValueError``)
whose ``param`` is the field and whose message names the value and the bound.
What needs the model — logit-bias token ids below the vocabulary size, a
tokenizer for ``bad_words`` and grammars — the engine checks when the request
arrives.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property

from typing import Any

from paged.errors import RequestError
from paged.sampling.structured import StructuredOutputsParams


def bad(name: str, value, rule: str, bound=None) -> None:
    """Refuse ``value`` for field ``name``: the message states the rule, ``param`` names the field."""
    raise RequestError(f"{name} must be {rule}, got {_short(value)}", param=name, bound=bound)


def _short(value) -> str:
    """``value`` for a message, cut to 200 characters (a refused list may be long)."""
    if isinstance(value, int) and value.bit_length() > 64:
        return f"an integer of {value.bit_length()} bits"
    try:
        text = repr(value)
    except ValueError:  # an integer past Python's 4 300-digit string limit, inside a list
        return f"a {type(value).__name__} holding a huge integer"
    return text if len(text) <= 200 else text[:200] + "..."


def number_in(value, lo: float, hi: float) -> bool:
    """A real number (not a bool, not NaN) in [lo, hi]."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and lo <= value <= hi


@dataclass
class SamplingParams:
    """Sampling settings of one request.

    Attributes:
        n: number of completions returned. Step03 supports 1; step04 adds n > 1.
        best_of: completions generated, the ``n`` best kept (step04). None = n.
        temperature: 0 means greedy; otherwise logits are divided by it.
        top_p: keep the smallest set of tokens whose probability reaches top_p.
        top_k: keep the k most likely tokens; -1 (or 0) keeps all.
        max_tokens: most tokens generated (>= 1).
        min_tokens: EOS and stop tokens are ignored until this many are generated.
        stop: strings that end generation; the stop string is not returned.
        stop_token_ids: token ids that end generation (kept in the output ids).
        ignore_eos: keep generating past the model's end-of-sequence token.
        seed: seeds this request's own random generator, so its samples do not
            depend on what else is in the batch.
        logprobs: if set, return the log-probability of each sampled token and
            of the ``logprobs`` most likely tokens at each position (0..20).
        prompt_logprobs: if set, also the log-probability of every prompt token
            (after the first) and the ``prompt_logprobs`` most likely tokens at
            its position (0..20), computed during prefill.
        use_beam_search, length_penalty, early_stopping: beam search (step04).
        presence_penalty: subtracted once from the logit of every token already
            generated (OpenAI's definition), in [-2, 2].
        frequency_penalty: subtracted from each token's logit once per time it
            was generated, in [-2, 2].
        repetition_penalty: divides the positive logits and multiplies the
            negative ones of every token of the prompt or the output (the
            multiplicative penalty of Keskar et al. 2019); 1 is off, > 0.
        logit_bias: ``{token id: bias}`` added to those logits, bias in [-100, 100].
        min_p: drop tokens whose probability is below ``min_p`` times the most
            likely token's (after temperature), in [0, 1].
        bad_words: words never generated: the last token of each word's
            tokenization is banned whenever the tokens before it were just generated.
        structured_outputs: a ``StructuredOutputsParams`` (JSON schema, JSON object,
            regex, choice or grammar) the output must follow; ``guided_decoding`` is
            vLLM's older name for the same field (either may be given, not both).
        logits_processors: callables ``fn(output_token_ids, logits) -> logits``
            applied to this request's row of logits ``[V]`` before anything else
            (vLLM's offline hook; in-process only, not over HTTP). One that raises
            ends this request with its error; the rest of the batch is not touched.
        allowed_token_ids: only these tokens may be drawn (a mask applied as the first
            logits processor).
        cache_salt: the prefix cache shares this request's prompt blocks only with requests of the
            same salt (the salt is mixed into its first block's hash, step04): a tenant's prompts can
            then not be found, nor timed, by another's. vLLM takes it with the prompt; here it rides
            with the rest of the request's settings. At most ``MAX_SALT_CHARS`` characters.

    vLLM's keywords that shape the returned text rather than the tokens are honoured by
    ``LLM.generate`` (the engine always detokenizes the same way): ``include_stop_str_in_output``
    (the stop string that ended the text is kept), ``skip_special_tokens`` (False: the text is the
    decode of every token), ``detokenize`` (False: no text), ``truncate_prompt_tokens`` (the prompt
    keeps its last N tokens). ``spaces_between_special_tokens`` must stay True (the tokenizer has
    no such switch); ``output_kind`` and ``extra_args`` are accepted and unused.

    Sizes are bounded too (the ``MAX_*`` constants, stated on docs/serving.md), so
    that what a request costs the engine per iteration is bounded: at most
    ``MAX_STOP`` stop strings of ``MAX_STOP_CHARS``, ``MAX_LIST`` stop token ids,
    logit biases and bad words (of at most ``MAX_BAD_WORD_CHARS`` each).
    """

    n: int = 1
    best_of: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    max_tokens: int = 16
    min_tokens: int = 0
    stop: list[str] | str | None = None
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    seed: int | None = None
    logprobs: int | None = None
    use_beam_search: bool = False
    length_penalty: float = 1.0
    early_stopping: bool | str = False
    prompt_logprobs: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: dict[int, float] | None = None
    min_p: float = 0.0
    bad_words: list[str] | None = None
    guided_decoding: StructuredOutputsParams | None = None
    logits_processors: list | None = None
    structured_outputs: StructuredOutputsParams | None = None
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    detokenize: bool = True
    truncate_prompt_tokens: int | None = None
    allowed_token_ids: list[int] | None = None
    output_kind: Any = None
    extra_args: dict | None = None
    cache_salt: str | None = None

    MAX_LOGPROBS = 20
    MAX_LOGIT_BIAS = 100.0
    MAX_ADDITIVE_PENALTY = 2.0
    MAX_SALT_CHARS = 256  # cache_salt: a key, not a document
    MAX_ALLOWED_TOKENS = 262_144  # allowed_token_ids: Gemma 3's whole vocabulary
    MAX_INT64 = 2**63 - 1  # seed and top_k: what a torch generator and an index tensor hold (vLLM's seed bound)
    MAX_LENGTH_PENALTY = 10.0  # |length_penalty|: length ** 10 stays finite for any context
    MAX_STOP = 64
    MAX_STOP_CHARS = 1024
    MAX_LIST = 1024  # stop_token_ids, logit_bias entries, bad_words
    MAX_BAD_WORD_CHARS = 256

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop or [])
        self.stop_token_ids = list(self.stop_token_ids or [])
        if self.best_of is None:
            self.best_of = self.n
        if self.structured_outputs is not None and self.guided_decoding is not None \
                and self.structured_outputs is not self.guided_decoding:
            raise RequestError("give structured_outputs or guided_decoding (its older name), not both",
                               param="structured_outputs")
        self.guided_decoding = self.structured_outputs = self.guided_decoding or self.structured_outputs
        self._check()
        self._check_vllm_keywords()
        self._check_logit_processing()

    def _check(self) -> None:
        if not isinstance(self.n, int) or self.n < 1:
            bad("n", self.n, "an integer >= 1", 1)
        if not isinstance(self.best_of, int) or self.best_of < self.n:
            bad("best_of", self.best_of, f"an integer >= n ({self.n})", self.n)
        if not isinstance(self.temperature, (int, float)) or not 0.0 <= self.temperature <= 100.0:
            bad("temperature", self.temperature, "a number in [0, 100]", (0.0, 100.0))
        if not isinstance(self.top_p, (int, float)) or not 0.0 < self.top_p <= 1.0:
            bad("top_p", self.top_p, "a number in (0, 1]", (0.0, 1.0))
        if not isinstance(self.top_k, int) or (self.top_k < 0 and self.top_k != -1) or self.top_k > self.MAX_INT64:
            bad("top_k", self.top_k, f"-1 (disabled), 0 (disabled) or a positive integer <= {self.MAX_INT64}",
                (-1, self.MAX_INT64))
        if not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            bad("max_tokens", self.max_tokens, "an integer >= 1", 1)
        if not isinstance(self.min_tokens, int) or not 0 <= self.min_tokens <= self.max_tokens:
            bad("min_tokens", self.min_tokens, f"an integer in [0, max_tokens={self.max_tokens}]",
                (0, self.max_tokens))
        if any(not isinstance(s, str) or not s for s in self.stop):
            bad("stop", self.stop, "a list of non-empty strings")
        if len(self.stop) > self.MAX_STOP or any(len(s) > self.MAX_STOP_CHARS for s in self.stop):
            raise RequestError(f"stop must be at most {self.MAX_STOP} strings of at most {self.MAX_STOP_CHARS} "
                               f"characters, got {len(self.stop)} of up to {max(map(len, self.stop))}",
                               param="stop", bound=(self.MAX_STOP, self.MAX_STOP_CHARS))
        if any(isinstance(t, bool) or not isinstance(t, int) or not 0 <= t <= self.MAX_INT64
               for t in self.stop_token_ids):
            bad("stop_token_ids", self.stop_token_ids, "a list of non-negative token ids")
        if len(self.stop_token_ids) > self.MAX_LIST:
            raise RequestError(f"stop_token_ids has {len(self.stop_token_ids)} entries; at most {self.MAX_LIST} "
                               "are allowed", param="stop_token_ids", bound=self.MAX_LIST)
        if self.cache_salt is not None and (not isinstance(self.cache_salt, str)
                                            or not 1 <= len(self.cache_salt) <= self.MAX_SALT_CHARS):
            bad("cache_salt", self.cache_salt, f"None or a string of 1 to {self.MAX_SALT_CHARS} characters")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int)
                                      or not 0 <= self.seed <= self.MAX_INT64):
            bad("seed", self.seed, f"None or a non-negative integer <= {self.MAX_INT64} (2**63 - 1)",
                (0, self.MAX_INT64))
        if self.logprobs is not None and (
            not isinstance(self.logprobs, int) or not 0 <= self.logprobs <= self.MAX_LOGPROBS
        ):
            bad("logprobs", self.logprobs, f"None or an integer in [0, {self.MAX_LOGPROBS}]",
                (0, self.MAX_LOGPROBS))
        lp = self.MAX_LENGTH_PENALTY
        if not number_in(self.length_penalty, -lp, lp):
            bad("length_penalty", self.length_penalty, f"a number in [-{lp:g}, {lp:g}]", (-lp, lp))
        if self.early_stopping not in (True, False, "never"):
            bad("early_stopping", self.early_stopping, "True, False or 'never'")

    def _check_vllm_keywords(self) -> None:
        """vLLM's keywords about the returned text, the prompt's length and the allowed tokens."""
        for name in ("include_stop_str_in_output", "skip_special_tokens", "detokenize"):
            if not isinstance(getattr(self, name), bool):
                bad(name, getattr(self, name), "True or False")
        if self.spaces_between_special_tokens is not True:
            bad("spaces_between_special_tokens", self.spaces_between_special_tokens,
                "True (the tokenizer decodes special tokens without a switch for the spaces between them)")
        t = self.truncate_prompt_tokens
        if t is not None and (isinstance(t, bool) or not isinstance(t, int) or t < 1):
            bad("truncate_prompt_tokens", t, "None or an integer >= 1", 1)
        allowed = self.allowed_token_ids
        if allowed is not None:
            if not isinstance(allowed, list) or not allowed or any(
                    isinstance(i, bool) or not isinstance(i, int) or not 0 <= i <= self.MAX_INT64 for i in allowed):
                bad("allowed_token_ids", allowed, "a non-empty list of token ids")
            if len(allowed) > self.MAX_ALLOWED_TOKENS:
                raise RequestError(f"allowed_token_ids has {len(allowed)} entries; at most {self.MAX_ALLOWED_TOKENS} "
                                   "are allowed", param="allowed_token_ids", bound=self.MAX_ALLOWED_TOKENS)
            from paged.sampling.allowed_tokens import AllowedTokens

            self.logits_processors = [AllowedTokens(allowed), *(self.logits_processors or [])]
        if self.extra_args is not None and not isinstance(self.extra_args, dict):
            bad("extra_args", self.extra_args, "None or a dict")

    def _check_logit_processing(self) -> None:
        """Bounds of the penalties, biases, bans and grammars (vLLM's and OpenAI's)."""
        if self.prompt_logprobs is not None and (
            not isinstance(self.prompt_logprobs, int) or not 0 <= self.prompt_logprobs <= self.MAX_LOGPROBS
        ):
            bad("prompt_logprobs", self.prompt_logprobs, f"None or an integer in [0, {self.MAX_LOGPROBS}]",
                (0, self.MAX_LOGPROBS))
        limit = self.MAX_ADDITIVE_PENALTY
        for name in ("presence_penalty", "frequency_penalty"):
            if not number_in(getattr(self, name), -limit, limit):
                bad(name, getattr(self, name), f"a number in [-{limit:g}, {limit:g}]", (-limit, limit))
        rp = self.repetition_penalty
        if not number_in(rp, 0.0, math.inf) or rp == 0.0 or math.isinf(rp):
            bad("repetition_penalty", self.repetition_penalty, "a finite number > 0 (1 disables it)", 0.0)
        if not number_in(self.min_p, 0.0, 1.0):
            bad("min_p", self.min_p, "a number in [0, 1]", (0.0, 1.0))
        bias = self.logit_bias or {}
        if not isinstance(bias, dict) or any(isinstance(t, bool) or not isinstance(t, int) or t < 0 for t in bias):
            bad("logit_bias", self.logit_bias, "a dict {token id (int >= 0): bias}")
        if len(bias) > self.MAX_LIST:
            raise RequestError(f"logit_bias has {len(bias)} entries; at most {self.MAX_LIST} are allowed",
                               param="logit_bias", bound=self.MAX_LIST)
        hi = self.MAX_LOGIT_BIAS
        outside = {t: b for t, b in bias.items() if not number_in(b, -hi, hi)}
        if outside:
            bad("logit_bias", outside, f"biases in [-{hi:g}, {hi:g}]", (-hi, hi))
        if self.bad_words is not None and (
            not isinstance(self.bad_words, list) or any(not isinstance(w, str) or not w.strip() for w in self.bad_words)
        ):
            bad("bad_words", self.bad_words, "a list of non-empty strings")
        words = self.bad_words or []
        if len(words) > self.MAX_LIST or any(len(w) > self.MAX_BAD_WORD_CHARS for w in words):
            raise RequestError(f"bad_words must be at most {self.MAX_LIST} words of at most "
                               f"{self.MAX_BAD_WORD_CHARS} characters, got {len(words)} of up to "
                               f"{max(map(len, words))}", param="bad_words",
                               bound=(self.MAX_LIST, self.MAX_BAD_WORD_CHARS))
        if self.logits_processors is not None and (
            not isinstance(self.logits_processors, list) or not all(map(callable, self.logits_processors))
        ):
            bad("logits_processors", self.logits_processors, "a list of callables fn(output_token_ids, logits)")
        g = self.guided_decoding
        if g is not None:
            if not isinstance(g, StructuredOutputsParams):
                bad("structured_outputs", g, "a StructuredOutputsParams")
            if self.use_beam_search:
                bad("use_beam_search", True, "False with guided_decoding (beams rank unconstrained extensions)")
            if self.min_tokens:
                bad("min_tokens", self.min_tokens, "0 with guided_decoding (the grammar decides where the text ends)")
            if self.ignore_eos:
                bad("ignore_eos", self.ignore_eos, "False with guided_decoding (the grammar ends with EOS)")

    @cached_property
    def processes_logits(self) -> bool:
        """Whether the sampler needs this request's history or grammar (a ``SamplingContext``).

        False for every request that sets none of the penalties, biases, bans,
        grammars, ``min_tokens`` or prompt logprobs: those rows take the plain
        path, with no per-row work at all.
        """
        return bool(
            self.presence_penalty or self.frequency_penalty or self.repetition_penalty != 1.0
            or self.logit_bias or self.bad_words or self.guided_decoding is not None
            or self.min_tokens or self.prompt_logprobs is not None or self.logits_processors
        )

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0
