"""The request bodies the server accepts, as pydantic models (OpenAI's fields, plus vLLM's extras).

Types are strict (``"5"`` is not an integer, ``true`` is not a number); a
field the server does not know is accepted, ignored and logged once, as vLLM
does (``extensions.OpenAIModel``). Bounds on sampling fields are checked once, by
``SamplingParams`` (its messages name the field and the bound); what only the
server knows — the context left for ``max_tokens``, streaming with ranked
outputs — is checked in ``generation.py``. Structured output has three
spellings: OpenAI's ``response_format``, vLLM's ``structured_outputs``
(``{json | regex | choice | grammar | json_object}``) and its older
``guided_json``, ``guided_regex``, ``guided_choice``, ``guided_grammar``; a
request may use one of them. The chat request lives in ``chat_protocol.py``.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import Field, PrivateAttr, StrictBool, StrictFloat, StrictInt, StrictStr, model_validator

from paged import SamplingParams
from paged.serve.errors import APIError
from paged.serve.extensions import CompletionExtensions, Items, OpenAIModel
from paged.step04_sharing.engine import MAX_BEST_OF
from paged.errors import RequestError
from paged.sampling.structured import (MAX_CHOICE_CHARS, MAX_CHOICES, MAX_GRAMMAR_CHARS, MAX_REGEX_CHARS,
                                       MAX_REGEX_REPEAT, MAX_SCHEMA_BYTES, StructuredOutputsParams)

Number = StrictFloat  # accepts 1 and 1.5, refuses "1" and true
MAX_LOGPROBS = SamplingParams.MAX_LOGPROBS
SP = SamplingParams  # its MAX_* bounds, published here


def bounds(**keywords) -> dict:
    """JSON-schema bounds (``minimum=0``, ``exclusive_minimum=0``, ``min_length=1``...) for the published document.

    They are enforced by ``SamplingParams`` and the engine, whose messages name
    the field and the bound; here they only tell clients (and the fuzzing test,
    which checks that every value outside them is refused). Names are JSON
    Schema's keywords, spelt in snake case or as JSON Schema spells them.
    """
    return {"json_schema_extra": {re.sub(r"_(\w)", lambda m: m.group(1).upper(), key): value
                                  for key, value in keywords.items()}}

# what a field takes, for the error message when it takes several types (pydantic reports each member)
EXPECTED = {
    "prompt": "a string, a list of strings, a list of token ids, or a list of token-id lists",
    "stop": "a string or a list of strings",
    "content": "a string or a list of {\"type\": \"text\", \"text\": ...} parts",
    "tool_choice": "\"none\", \"auto\", \"required\", {\"type\": \"function\", \"function\": {\"name\": ...}} or "
                   "{\"type\": \"allowed_tools\", \"allowed_tools\": {\"mode\", \"tools\"}}",
}


# Prompts in one completions request. vLLM sets none; here a request may fill one iteration of the
# engine's default batch (--max-num-seqs 256) and no more: prompts beyond it would only wait in the
# queue, holding the request (and its client's connection) open, so more requests do the same work
# with fairer turns. A list of token ids is one prompt.
MAX_PROMPTS = 256


def count_prompts(prompt) -> int:
    """How many prompts ``prompt`` (the parsed JSON value) holds: one for a string or a list of token ids."""
    if isinstance(prompt, list) and prompt and not isinstance(prompt[0], int):
        return len(prompt)
    return 1


# the longest lists a field may hold: checked on the parsed body before pydantic walks each item
LIST_BOUNDS = {"stop": SP.MAX_STOP, "stop_token_ids": SP.MAX_LIST, "logit_bias": SP.MAX_LIST,
               "bad_words": SP.MAX_LIST, "guided_choice": MAX_CHOICES}

NonEmpty = Annotated[StrictStr, Field(**bounds(min_length=1))]
StopString = Annotated[StrictStr, Field(**bounds(min_length=1, max_length=SP.MAX_STOP_CHARS))]
BadWord = Annotated[StrictStr, Field(**bounds(min_length=1, max_length=SP.MAX_BAD_WORD_CHARS))]


class StreamOptions(OpenAIModel):
    include_usage: StrictBool | None = None  # None: False, but continuous_usage_stats still sends usage (vLLM)
    continuous_usage_stats: StrictBool = False  # vLLM's: usage in every chunk, not only after the last


class JsonSchemaFormat(OpenAIModel):
    """``response_format.json_schema``: OpenAI's named schema (``strict`` is always honoured)."""

    model_config = {"populate_by_name": True}
    name: StrictStr
    description: StrictStr | None = None
    json_schema: dict = Field(alias="schema")
    strict: StrictBool | None = None


class ResponseFormat(OpenAIModel):
    """``response_format``: plain text, any JSON object, or JSON valid against a schema."""

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


GUIDED_GRAMMAR_DOC = f"a Lark or GBNF grammar of at most {MAX_GRAMMAR_CHARS} characters"


class StructuredOutputs(OpenAIModel):
    """vLLM's ``structured_outputs``: exactly one of its shapes."""

    json_schema: dict | StrictStr | None = Field(None, alias="json", description=f"a JSON schema of at most "
                                                 f"{MAX_SCHEMA_BYTES} bytes as compact JSON")
    regex: StrictStr | None = Field(None, **bounds(max_length=MAX_REGEX_CHARS))
    choice: Items[StrictStr] | None = Field(None, **bounds(max_items=MAX_CHOICES))
    grammar: StrictStr | None = Field(None, description=GUIDED_GRAMMAR_DOC, **bounds(max_length=MAX_GRAMMAR_CHARS))
    json_object: StrictBool | None = None

    model_config = {"populate_by_name": True}

    def spec(self) -> dict:
        """The one shape given, as ``StructuredOutputsParams`` keywords (empty when none is)."""
        given = {k: v for k, v in (("json", self.json_schema), ("regex", self.regex), ("choice", self.choice),
                                   ("grammar", self.grammar), ("json_object", self.json_object)) if v}
        if len(given) != 1:
            raise APIError(f"structured_outputs takes exactly one of json, regex, choice, grammar, json_object; "
                           f"got {sorted(given) or 'none'}", param="structured_outputs", code="invalid_value")
        return given


STRUCTURED_FIELDS = ("response_format", "structured_outputs", "guided_json", "guided_regex", "guided_choice",
                     "guided_grammar")


class _Sampling(OpenAIModel):
    """Fields both endpoints share."""

    model: StrictStr | None = None
    temperature: Number | None = Field(None, **bounds(minimum=0, maximum=100))  # None: 1.0, or 0 for beam search
    top_p: Number = Field(1.0, **bounds(exclusive_minimum=0, maximum=1))
    top_k: StrictInt = Field(-1, **bounds(minimum=-1, maximum=SP.MAX_INT64))
    min_tokens: StrictInt = Field(0, **bounds(minimum=0))
    n: StrictInt = Field(1, **bounds(minimum=1, maximum=MAX_BEST_OF))
    best_of: StrictInt | None = Field(None, **bounds(minimum=1, maximum=MAX_BEST_OF))
    use_beam_search: StrictBool = False
    length_penalty: Number = Field(1.0, **bounds(minimum=-SP.MAX_LENGTH_PENALTY, maximum=SP.MAX_LENGTH_PENALTY))
    stop: StopString | Items[StopString] | None = Field(None, **bounds(max_items=SP.MAX_STOP))
    stop_token_ids: Items[Annotated[StrictInt, Field(**bounds(minimum=0, maximum=SP.MAX_INT64))]] | None = Field(
        None, **bounds(max_items=SP.MAX_LIST))
    seed: StrictInt | None = Field(None, **bounds(minimum=0, maximum=SP.MAX_INT64))
    ignore_eos: StrictBool = False
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    user: StrictStr | None = None
    presence_penalty: Number = Field(0.0, **bounds(minimum=-2, maximum=2))
    frequency_penalty: Number = Field(0.0, **bounds(minimum=-2, maximum=2))
    repetition_penalty: Number = Field(1.0, **bounds(exclusive_minimum=0))
    logit_bias: dict[str, Annotated[Number, Field(**bounds(minimum=-100, maximum=100))]] | None = Field(
        None, **bounds(max_properties=SP.MAX_LIST, property_names={"pattern": "^[0-9]{1,20}$"}))
    min_p: Number = Field(0.0, **bounds(minimum=0, maximum=1))
    bad_words: Items[BadWord] | None = Field(None, **bounds(max_items=SP.MAX_LIST))
    response_format: ResponseFormat | None = None
    guided_json: dict | StrictStr | None = Field(None, description=f"a JSON schema of at most {MAX_SCHEMA_BYTES} "
                                                 "bytes as compact JSON")
    guided_regex: StrictStr | None = Field(None, description=f"at most {MAX_REGEX_CHARS} characters, and at most "
                                           f"{MAX_REGEX_REPEAT} atoms once counted repetitions (a{{n}}) are "
                                           "multiplied out", **bounds(max_length=MAX_REGEX_CHARS))
    guided_choice: Items[StrictStr] | None = Field(None, description=f"at most {MAX_CHOICES} strings of at most "
                                                  f"{MAX_CHOICE_CHARS} characters in all",
                                                  **bounds(max_items=MAX_CHOICES))
    guided_grammar: StrictStr | None = Field(None, description=GUIDED_GRAMMAR_DOC,
                                             **bounds(max_length=MAX_GRAMMAR_CHARS))
    structured_outputs: StructuredOutputs | None = None
    _forced: tuple[str, dict] | None = PrivateAttr(None)  # (field, JSON schema): a tool choice's constraint

    def force_json(self, field: str, schema: dict) -> None:
        """Constrain the output to ``schema`` for ``field`` (a tool choice), refusing another constraint."""
        given = [f for f in STRUCTURED_FIELDS if self._given(f)]
        if given:
            raise APIError(f"{field} forces the output to the tool's arguments; it cannot be combined with "
                           f"{given[0]}", param=given[0], code="invalid_value")
        self._forced = (field, schema)

    def _given(self, field: str) -> bool:
        value = getattr(self, field)
        return value is not None and not (field == "response_format" and value.type == "text")

    @model_validator(mode="after")
    def _stream_options_need_stream(self):
        if self.stream_options is not None and not self.stream:
            raise APIError("stream_options is only allowed with stream: true", param="stream_options")
        return self

    def sampling_params(self, max_tokens: int, logprobs: int | None, prompt_logprobs: int | None = None,
                        defaults: dict | None = None) -> SamplingParams:
        """The engine's ``SamplingParams``; raises ``RequestError`` naming a field and its bound.

        ``defaults``: values for the sampling fields this request did not set (the model's generation
        config, ``--generation-config``).
        """
        own = {k: v for k, v in (defaults or {}).items() if k not in self.model_fields_set}
        temperature = self.temperature if self.temperature is not None else own.get(
            "temperature", 0.0 if self.use_beam_search else 1.0)
        return SamplingParams(
            n=self.n, best_of=self.best_of, temperature=temperature, top_p=own.get("top_p", self.top_p),
            top_k=own.get("top_k", self.top_k), min_p=own.get("min_p", self.min_p),
            repetition_penalty=own.get("repetition_penalty", self.repetition_penalty),
            max_tokens=max_tokens, min_tokens=self.min_tokens, stop=self.stop,
            stop_token_ids=self.stop_token_ids or [], ignore_eos=self.ignore_eos, seed=self.seed,
            logprobs=logprobs, use_beam_search=self.use_beam_search, length_penalty=self.length_penalty,
            prompt_logprobs=prompt_logprobs, presence_penalty=self.presence_penalty,
            frequency_penalty=self.frequency_penalty,
            logit_bias=self._token_biases(), bad_words=self.bad_words,
            structured_outputs=self._structured_outputs(), cache_salt=self.cache_salt,
            allowed_token_ids=self.allowed_token_ids,
        )

    def _token_biases(self) -> dict[int, float] | None:
        """``logit_bias`` with its keys (token ids as JSON strings, as OpenAI sends them) as ints."""
        if not self.logit_bias:
            return None
        keys = [k for k in self.logit_bias if not re.fullmatch(r"[0-9]{1,20}", k)]  # ASCII digits only
        if keys:
            raise APIError(f"logit_bias keys must be token ids (decimal strings of ASCII digits like \"50256\"), "
                           f"got {[k[:24] for k in keys[:5]]}", param="logit_bias", code="invalid_value")
        return {int(k): bias for k, bias in self.logit_bias.items()}

    def _structured_outputs(self) -> StructuredOutputsParams | None:
        """The one structured-output field given (or a tool choice's), as the engine's params."""
        if self._forced is not None:
            field, schema = self._forced
            spec = {"json": schema}
        else:
            given = [f for f in STRUCTURED_FIELDS if self._given(f)]
            if len(given) > 1:
                raise APIError(f"give at most one of {', '.join(STRUCTURED_FIELDS)}; got {given}", param=given[1],
                               code="invalid_value")
            if not given:
                return None
            field = given[0]
            spec = self._spec(field)
        try:
            return StructuredOutputsParams(**spec)
        except RequestError as e:
            raise APIError(f"{field}: {e}", param=field, code="invalid_value") from None

    def _spec(self, field: str) -> dict:
        """``StructuredOutputsParams`` keywords of one structured-output field."""
        if field == "response_format":
            fmt = self.response_format
            if fmt.type == "json_object":
                return dict(json_object=True)
            if fmt.json_schema is None:
                raise APIError("response_format of type json_schema needs json_schema: {name, schema}",
                               param="response_format", code="invalid_value")
            return dict(json=fmt.json_schema.json_schema)
        if field == "structured_outputs":
            return self.structured_outputs.spec()
        return {field.removeprefix("guided_"): getattr(self, field)}

    @property
    def wants_grammar(self) -> bool:
        """Structured output is asked for (a grammar will be compiled for it)."""
        return self._forced is not None or any(self._given(f) for f in STRUCTURED_FIELDS)

    def guided_rename(self) -> dict[str, str]:
        """Engine field names of structured output -> the field this request used (``guided_regex``)."""
        field = self._forced[0] if self._forced else next((f for f in STRUCTURED_FIELDS if self._given(f)),
                                                          "response_format")
        return {name: field for name in ("guided_decoding", *(f"guided_decoding.{k}" for k in
                                                             ("json", "json_object", "regex", "choice", "grammar")))}

    @property
    def include_usage(self) -> bool:
        """The usage-only chunk at the end: asked for, or implied by ``continuous_usage_stats`` as in vLLM."""
        o = self.stream_options
        return bool(o and (o.include_usage or (o.include_usage is None and o.continuous_usage_stats)))

    @property
    def continuous_usage(self) -> bool:
        """``usage`` in every chunk (vLLM's ``continuous_usage_stats``; off when ``include_usage`` is false)."""
        o = self.stream_options
        return bool(o and o.continuous_usage_stats and o.include_usage is not False)


class CompletionRequest(_Sampling, CompletionExtensions):
    """``POST /v1/completions``: a prompt as text, texts, token ids, or lists of token ids."""

    prompt: (StrictStr | Annotated[Items[StrictStr], Field(**bounds(max_items=MAX_PROMPTS))] | Items[StrictInt]
             | Annotated[Items[Items[StrictInt]], Field(**bounds(max_items=MAX_PROMPTS))]) = Field(
        **bounds(min_items=1), description=f"one prompt, or a list of at most {MAX_PROMPTS}")
    max_tokens: StrictInt | None = Field(16, **bounds(minimum=1))
    logprobs: StrictInt | None = Field(None, **bounds(minimum=0, maximum=MAX_LOGPROBS))
    echo: StrictBool = False
    suffix: None = None

    def prompts(self) -> list[str | list[int]]:
        """The prompts of this request, each a string or a token-id list."""
        p = self.prompt
        if isinstance(p, str):
            return [p]
        if not p:
            raise APIError("prompt is an empty list: give a string, a list of strings or token ids",
                           param="prompt", code="invalid_value")
        if isinstance(p[0], int):
            return [list(p)]
        for i, one in enumerate(p):
            if isinstance(one, list) and not one:
                raise APIError(f"prompt[{i}] is an empty token list", param="prompt", code="invalid_value")
        return list(p)
