"""Structured output: a grammar masks the logits so the text always parses (vLLM's guided decoding).

A request asks for one of five shapes (``StructuredOutputsParams``, vLLM's name
since v0.12; ``GuidedDecodingParams`` is the older one): text that validates
against a JSON schema, any JSON object, a regular expression, one of a list of
strings, or a context-free grammar (Lark, or GBNF as llama.cpp writes it). The grammar engine is llguidance (the Rust library behind
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
import re
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING

from paged.errors import RequestError

if TYPE_CHECKING:
    import llguidance
    from tokenizers import Tokenizer

# Compact JSON with json.dumps' separators; no free whitespace, which a small
# model could otherwise repeat until max_tokens.
JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}

# Bounds on what a request may ask the grammar engine to build (vLLM sets none; these are
# chosen so that compiling a grammar and its first masks takes milliseconds, and stated
# on docs/serving.md). llguidance's own limits (2 000 items in a parser row, 50 000 per
# step, lexer fuel) stay as they are; a grammar that reaches one of them while it runs
# ends its own request with a 400 (``GrammarMatcher.sync``).
MAX_SCHEMA_BYTES = 64 * 1024  # a JSON schema, serialized compactly
MAX_REGEX_CHARS = 4096
MAX_REGEX_REPEAT = 1000  # the regex's counted repetitions, expanded: a{1000} is 1000, (a{10}){10} is 100
MAX_CHOICES = 1000  # llguidance allows 2 000 alternatives in one row
MAX_CHOICE_CHARS = 64 * 1024  # all choices together
MAX_GRAMMAR_CHARS = 16 * 1024
# A grammar's counted repetitions expanded (``regex_repeat_weight`` over its text: each character weighs
# one, so a grammar without counted repetitions stays far below): x{1000000} inside a grammar is the same
# bomb as in a regex.
MAX_GRAMMAR_REPEAT = 20_000
KINDS = ("json", "json_object", "regex", "choice", "grammar")


@dataclass(frozen=True)
class StructuredOutputsParams:
    """One structured-output constraint (exactly one field set), as vLLM's ``StructuredOutputsParams``.

    Attributes:
        json: a JSON schema (a dict or its JSON text); the output validates against it.
        json_object: any JSON object (OpenAI's ``response_format: {"type": "json_object"}``).
        regex: the whole output matches this regular expression (Rust ``regex`` syntax).
        choice: the output is exactly one of these strings.
        grammar: a context-free grammar the whole output follows: Lark (``start: ...``, llguidance's
            dialect) or GBNF (``root ::= ...``, llama.cpp's), told apart by GBNF's ``::=``.
    """

    json: dict | str | None = None
    json_object: bool = False
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None

    def __post_init__(self) -> None:
        given = [name for name in KINDS if getattr(self, name)]
        if len(given) != 1:
            raise RequestError(f"structured output takes exactly one of json, json_object, regex, choice, grammar; "
                               f"got {given or 'none'}", param="guided_decoding")
        _ = self.compiled  # compiled now, so a bad schema, regex or grammar is refused at construction

    @property
    def kind(self) -> str:
        return next(n for n in KINDS if getattr(self, n))

    @cached_property
    def compiled(self) -> str:
        """The llguidance grammar (compiled once per request, shared by its sequences)."""
        return grammar_text(self)


GuidedDecodingParams = StructuredOutputsParams  # vLLM's name before v0.12


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
        _check_regex(spec.regex, param)
        grammar = llguidance.LLMatcher.grammar_from_regex(spec.regex)
    elif spec.grammar is not None:
        grammar = _lark(spec.grammar, param)
    else:
        if not isinstance(spec.choice, list) or not all(isinstance(c, str) and c for c in spec.choice):
            raise RequestError(f"{param} must be a non-empty list of non-empty strings, got {spec.choice!r:.200}",
                               param=param)
        if len(spec.choice) > MAX_CHOICES:
            raise RequestError(f"{param} has {len(spec.choice)} choices; at most {MAX_CHOICES} are allowed",
                               param=param, bound=MAX_CHOICES)
        chars = sum(map(len, spec.choice))
        if chars > MAX_CHOICE_CHARS:
            raise RequestError(f"{param} has {chars} characters in all; at most {MAX_CHOICE_CHARS} are allowed",
                               param=param, bound=MAX_CHOICE_CHARS)
        grammar = llguidance.LLMatcher.grammar_from_lark("start: " + " | ".join(json.dumps(c) for c in spec.choice))
    problem = llguidance.LLMatcher.validate_grammar(grammar)
    if problem:
        raise RequestError(f"{param} is not a valid grammar: {problem.strip()}", param=param)
    return grammar


def _lark(text, param: str) -> str:
    """A Lark or GBNF grammar (bounded like a regex: its counted repetitions expanded) as llguidance's."""
    import llguidance
    from llguidance.gbnf_to_lark import gbnf_to_lark

    if not isinstance(text, str) or not text.strip():
        raise RequestError(f"{param} must be a non-empty grammar text, got {text!r:.80}", param=param)
    _check_size(text, param, MAX_GRAMMAR_CHARS, MAX_GRAMMAR_REPEAT)
    try:
        lark = gbnf_to_lark(text) if "::=" in text else text
        return llguidance.LLMatcher.grammar_from_lark(lark)
    except Exception as e:  # the converter's and the parser's own errors name the line
        raise RequestError(f"{param} is not a valid grammar: {str(e).strip()[:300]}", param=param) from None


def _check_regex(regex: str, param: str) -> None:
    _check_size(regex, param, MAX_REGEX_CHARS, MAX_REGEX_REPEAT)


def _check_size(text: str, param: str, max_chars: int, max_repeat: int) -> None:
    """A regex's or a grammar's length, and its counted repetitions expanded (``regex_repeat_weight``)."""
    if len(text) > max_chars:
        raise RequestError(f"{param} has {len(text)} characters; at most {max_chars} are allowed",
                           param=param, bound=max_chars)
    weight = regex_repeat_weight(text)
    if weight > max_repeat:
        raise RequestError(f"{param} expands to {weight} repeated atoms (its counted repetitions such as "
                           f"a{{n}} multiplied out); at most {max_repeat} are allowed", param=param, bound=max_repeat)


def _schema_object(schema, param: str) -> dict:
    """The schema as a dict: JSON text is parsed, anything but an object refused."""
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except json.JSONDecodeError as e:
            raise RequestError(f"{param} is not valid JSON: {e}", param=param) from None
    if not isinstance(schema, dict):
        raise RequestError(f"{param} must be a JSON schema object, got {type(schema).__name__}", param=param)
    size = len(json.dumps(schema, separators=(",", ":")))
    if size > MAX_SCHEMA_BYTES:
        raise RequestError(f"{param} is {size} bytes as compact JSON; at most {MAX_SCHEMA_BYTES} are allowed",
                           param=param, bound=MAX_SCHEMA_BYTES)
    return schema


_REPEAT = re.compile(r"\{(\d+)(?:,(\d*))?\}")


def regex_repeat_weight(regex: str) -> int:
    """How many copies of its atoms ``regex`` asks for once its counted repetitions are expanded.

    Each atom counts 1; ``x{n}``, ``x{n,}`` and ``x{n,m}`` multiply the weight of
    ``x`` (an atom or a group) by ``n`` or ``m``; a group weighs the sum of its
    parts; ``*``, ``+`` and ``?`` add nothing. One pass, linear in the regex:
    it bounds the lexer's work before llguidance builds anything.
    """
    stack, total, last, i = [], 0, 0, 0  # per open group: (its total so far); last: the previous atom's weight
    while i < len(regex):
        c = regex[i]
        if c == "\\":
            total, last, i = total + 1, 1, i + 2
            continue
        if c == "[":  # a class is one atom; skip to its closing bracket (a leading ] or ^] is literal)
            j = i + 1 + (regex[i + 1:i + 2] == "^")
            j += regex[j:j + 1] == "]"
            while j < len(regex) and regex[j] != "]":
                j += 2 if regex[j] == "\\" else 1
            total, last, i = total + 1, 1, j + 1
            continue
        if c == "(":
            stack.append(total)
            total, last, i = 0, 0, i + 1
            continue
        if c == ")" and stack:
            inner = total
            total, last, i = stack.pop() + inner, inner, i + 1
            continue
        m = _REPEAT.match(regex, i) if c == "{" else None
        if m:
            n = int(m.group(2)) if m.group(2) else int(m.group(1))
            total += last * (n - 1)
            last *= n
            i = m.end()
            continue
        if c not in "*+?|^$":
            total, last = total + 1, 1
        i += 1
    return total


class GrammarCompiler:
    """Turns requests into per-sequence matchers for one tokenizer (built once: about 0.1-1 s).

    Args:
        tokenizer: the model's ``tokenizers.Tokenizer``.
        vocab_size: the model's vocabulary (its logits' width; may exceed the tokenizer's).
        eos_token_ids: the ids that end a sequence; the grammar allows them once the text is complete.
    """

    def __init__(self, tokenizer: Tokenizer, vocab_size: int, eos_token_ids: list[int]) -> None:
        import llguidance

        self.vocab_size = vocab_size
        try:
            self._tokenizer = llguidance.LLTokenizer(tokenizer.to_str(), n_vocab=vocab_size,
                                                     eos_token=list(eos_token_ids) or None)
        except Exception as e:  # a tokenizer llguidance cannot read: no grammar can run on this model
            raise RequestError(f"guided_decoding is not available for this model's tokenizer: {e}",
                               param="guided_decoding") from None

    def matcher(self, spec: GuidedDecodingParams) -> GrammarMatcher:
        """A fresh matcher for ``spec``, its first mask computed: a grammar that fails there
        (a schema that refers only to itself, a limit llguidance meets at once) is refused now,
        with a ``RequestError``, rather than when the request draws its first token."""
        import llguidance

        param = f"guided_decoding.{spec.kind}"
        m = llguidance.LLMatcher(self._tokenizer, spec.compiled, log_level=0,
                                 limits=llguidance.LLParserLimits(verbose_errors=False))
        matcher = GrammarMatcher(m, self.vocab_size, param)
        if not m.is_error():
            matcher.first_mask = m.compute_bitmask()
        if m.is_error():  # validated without the tokenizer; some limits show only with it
            raise RequestError(f"{param}: {_first_line(m.get_error())}", param=param)
        return matcher


def _first_line(error: str) -> str:
    """llguidance's error without the parser state it may append."""
    return error.strip().split("\n")[0]


class GrammarMatcher:
    """One sequence's position in its grammar: consumes its output tokens, answers the next mask.

    Args:
        matcher: the ``llguidance.LLMatcher``.
        vocab_size: the model's vocabulary.
        param: the request's field (``guided_decoding.regex``), named when the grammar fails.
    """

    def __init__(self, matcher: llguidance.LLMatcher, vocab_size: int, param: str = "guided_decoding") -> None:
        self._m = matcher
        self._words = (vocab_size + 31) // 32
        self.param = param
        self.consumed = 0  # output tokens fed so far
        self.first_mask: bytes | None = None  # computed at admission, used for the first draw

    def sync(self, output_token_ids: list[int]) -> None:
        """Feed the tokens generated since the last call (the sampler only drew allowed ones).

        Raises ``RequestError`` naming the field when the grammar fails on the way (it
        met one of llguidance's limits: too many items in a step, too many lexer states):
        the engine ends this request with it, and the others go on.
        """
        for token in output_token_ids[self.consumed:]:
            if not self._m.consume_token(token) or self._m.is_error():
                raise RequestError(f"{self.param}: the grammar failed at output token {self.consumed + 1}: "
                                   f"{_first_line(self._m.get_error())}", param=self.param)
            self.consumed += 1
            self.first_mask = None

    def bitmask(self) -> bytes:
        """Allowed next tokens: bit ``t % 32`` of little-endian int32 word ``t // 32`` is token ``t``."""
        mask = self.first_mask if self.first_mask is not None else self._m.compute_bitmask()
        if self._m.is_error():
            raise RequestError(f"{self.param}: the grammar failed after output token {self.consumed}: "
                               f"{_first_line(self._m.get_error())}", param=self.param)
        return mask[: 4 * self._words]
