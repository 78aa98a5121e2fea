"""``SamplingParams``: how one request wants its tokens chosen (vLLM's API shape).

Validation happens here, at construction, so a bad request is refused before
it touches the engine: every error is a ``RequestError`` (a ``ValueError``)
whose ``param`` is the field and whose message names the value and the bound.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from paged.step03_attention.errors import RequestError


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
        use_beam_search, length_penalty, early_stopping: beam search (step04).
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

    MAX_LOGPROBS = 20

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop or [])
        self.stop_token_ids = list(self.stop_token_ids or [])
        if self.best_of is None:
            self.best_of = self.n
        self._check()

    def _check(self) -> None:
        def bad(name, value, rule, bound=None):
            raise RequestError(f"{name} must be {rule}, got {value!r}", param=name, bound=bound)

        if not isinstance(self.n, int) or self.n < 1:
            bad("n", self.n, "an integer >= 1", 1)
        if not isinstance(self.best_of, int) or self.best_of < self.n:
            bad("best_of", self.best_of, f"an integer >= n ({self.n})", self.n)
        if not isinstance(self.temperature, (int, float)) or not 0.0 <= self.temperature <= 100.0:
            bad("temperature", self.temperature, "a number in [0, 100]", (0.0, 100.0))
        if not isinstance(self.top_p, (int, float)) or not 0.0 < self.top_p <= 1.0:
            bad("top_p", self.top_p, "a number in (0, 1]", (0.0, 1.0))
        if not isinstance(self.top_k, int) or (self.top_k < 0 and self.top_k != -1):
            bad("top_k", self.top_k, "-1 (disabled), 0 (disabled) or a positive integer")
        if not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            bad("max_tokens", self.max_tokens, "an integer >= 1", 1)
        if not isinstance(self.min_tokens, int) or not 0 <= self.min_tokens <= self.max_tokens:
            bad("min_tokens", self.min_tokens, f"an integer in [0, max_tokens={self.max_tokens}]",
                (0, self.max_tokens))
        if any(not isinstance(s, str) or not s for s in self.stop):
            bad("stop", self.stop, "a list of non-empty strings")
        if any(not isinstance(t, int) or t < 0 for t in self.stop_token_ids):
            bad("stop_token_ids", self.stop_token_ids, "a list of non-negative token ids")
        if self.seed is not None and (not isinstance(self.seed, int) or self.seed < 0):
            bad("seed", self.seed, "None or a non-negative integer", 0)
        if self.logprobs is not None and (
            not isinstance(self.logprobs, int) or not 0 <= self.logprobs <= self.MAX_LOGPROBS
        ):
            bad("logprobs", self.logprobs, f"None or an integer in [0, {self.MAX_LOGPROBS}]",
                (0, self.MAX_LOGPROBS))
        if not isinstance(self.length_penalty, (int, float)):
            bad("length_penalty", self.length_penalty, "a number")
        if self.early_stopping not in (True, False, "never"):
            bad("early_stopping", self.early_stopping, "True, False or 'never'")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0
