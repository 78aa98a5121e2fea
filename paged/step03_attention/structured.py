"""Structured output: a grammar masks the logits so the text always parses (vLLM's guided decoding).

A request asks for one of four shapes (``GuidedDecodingParams``): text that
validates against a JSON schema, any JSON object, a regular expression, or one
of a list of strings. The grammar engine is llguidance (the Rust library behind
vLLM's ``guidance`` backend): it compiles the request into a grammar once, and
a ``GrammarMatcher`` per sequence follows the tokens generated so far and
answers, before each draw, which tokens may come next — a bitmask of one bit
per vocabulary entry. The sampler sets every other logit to ``-inf``.

Where the state lives: the matcher belongs to the sequence on the engine side
and is a pure function of the sequence's output tokens. Before each iteration
the engine feeds it the tokens it has not seen yet (``GrammarMatcher.sync``),
then asks for the mask, which travels to the runner inside the plan as plain
bytes. A sequence that is swapped out or recomputed keeps its output tokens,
so its grammar resumes exactly where it stopped; nothing is stored on the
worker.

Once the text is complete the grammar allows only the end-of-sequence token,
so generation stops with ``finish_reason="stop"``; if ``max_tokens`` runs out
first the output is a prefix of a valid text (``finish_reason="length"``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cached_property

from paged.step03_attention.errors import RequestError

# Compact JSON with json.dumps' separators; no free whitespace, which a small
# model could otherwise repeat until max_tokens.
JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


@dataclass(frozen=True)
class GuidedDecodingParams:
    """One structured-output constraint (exactly one field set), as vLLM's ``GuidedDecodingParams``.

    Attributes:
        json: a JSON schema (a dict or its JSON text); the output validates against it.
        json_object: any JSON object (OpenAI's ``response_format: {"type": "json_object"}``).
        regex: the whole output matches this regular expression (Rust ``regex`` syntax).
        choice: the output is exactly one of these strings.
    """

    json: dict | str | None = None
    json_object: bool = False
    regex: str | None = None
    choice: list[str] | None = None

    def __post_init__(self) -> None:
        given = [name for name in ("json", "json_object", "regex", "choice") if getattr(self, name)]
        if len(given) != 1:
            raise RequestError(f"guided_decoding takes exactly one of json, json_object, regex, choice; "
                               f"got {given or 'none'}", param="guided_decoding")
        _ = self.grammar  # compiled now, so a bad schema or regex is refused at construction

    @property
    def kind(self) -> str:
        return next(n for n in ("json", "json_object", "regex", "choice") if getattr(self, n))

    @cached_property
    def grammar(self) -> str:
        """The llguidance grammar (compiled once per request, shared by its sequences)."""
        return grammar_text(self)


def grammar_text(spec: GuidedDecodingParams) -> str:
    """llguidance's grammar for ``spec``; raises ``RequestError`` naming the field when it is invalid."""
    import llguidance

    param = f"guided_decoding.{spec.kind}"
    if spec.json is not None:
        schema = _schema_object(spec.json, param)
        grammar = llguidance.LLMatcher.grammar_from_json_schema(schema, defaults=JSON_OPTIONS)
    elif spec.json_object:
        grammar = llguidance.LLMatcher.grammar_from_json_schema({"type": "object"}, defaults=JSON_OPTIONS)
    elif spec.regex is not None:
        if not isinstance(spec.regex, str):
            raise RequestError(f"{param} must be a string, got {spec.regex!r}", param=param)
        grammar = llguidance.LLMatcher.grammar_from_regex(spec.regex)
    else:
        if not isinstance(spec.choice, list) or not all(isinstance(c, str) and c for c in spec.choice):
            raise RequestError(f"{param} must be a non-empty list of non-empty strings, got {spec.choice!r}",
                               param=param)
        grammar = llguidance.LLMatcher.grammar_from_lark("start: " + " | ".join(json.dumps(c) for c in spec.choice))
    problem = llguidance.LLMatcher.validate_grammar(grammar)
    if problem:
        raise RequestError(f"{param} is not a valid grammar: {problem.strip()}", param=param)
    return grammar


def _schema_object(schema, param: str) -> dict:
    """The schema as a dict: JSON text is parsed, anything but an object refused."""
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except json.JSONDecodeError as e:
            raise RequestError(f"{param} is not valid JSON: {e}", param=param) from None
    if not isinstance(schema, dict):
        raise RequestError(f"{param} must be a JSON schema object, got {type(schema).__name__}", param=param)
    return schema


class GrammarCompiler:
    """Turns requests into per-sequence matchers for one tokenizer (built once: about 0.1-1 s).

    Args:
        tokenizer: the model's ``tokenizers.Tokenizer``.
        vocab_size: the model's vocabulary (its logits' width; may exceed the tokenizer's).
        eos_token_ids: the ids that end a sequence; the grammar allows them once the text is complete.
    """

    def __init__(self, tokenizer, vocab_size: int, eos_token_ids: list[int]) -> None:
        import llguidance

        self.vocab_size = vocab_size
        try:
            self._tokenizer = llguidance.LLTokenizer(tokenizer.to_str(), n_vocab=vocab_size,
                                                     eos_token=list(eos_token_ids) or None)
        except Exception as e:  # a tokenizer llguidance cannot read: no grammar can run on this model
            raise RequestError(f"guided_decoding is not available for this model's tokenizer: {e}",
                               param="guided_decoding") from None

    def matcher(self, spec: GuidedDecodingParams) -> GrammarMatcher:
        import llguidance

        m = llguidance.LLMatcher(self._tokenizer, spec.grammar, log_level=0)
        if m.is_error():  # validated without the tokenizer; some limits show only with it
            raise RequestError(f"guided_decoding.{spec.kind}: {m.get_error()}", param=f"guided_decoding.{spec.kind}")
        return GrammarMatcher(m, self.vocab_size)


class GrammarMatcher:
    """One sequence's position in its grammar: consumes its output tokens, answers the next mask."""

    def __init__(self, matcher, vocab_size: int) -> None:
        self._m = matcher
        self._words = (vocab_size + 31) // 32
        self.consumed = 0  # output tokens fed so far

    def sync(self, output_token_ids: list[int]) -> None:
        """Feed the tokens generated since the last call (the sampler only drew allowed ones)."""
        for token in output_token_ids[self.consumed:]:
            if not self._m.consume_token(token):
                raise RuntimeError(f"the grammar refused token {token}: {self._m.get_error()}")
        self.consumed = len(output_token_ids)

    def bitmask(self) -> bytes:
        """Allowed next tokens: bit ``t % 32`` of little-endian int32 word ``t // 32`` is token ``t``."""
        return self._m.compute_bitmask()[: 4 * self._words]
