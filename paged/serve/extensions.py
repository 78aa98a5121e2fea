"""vLLM's extensions to OpenAI's request bodies, field by field: honoured, ignored with a warning, or refused.

A user switching from vLLM points the same clients at this server, and those
clients send vLLM's extra fields (guidellm always sends
``stream_options.continuous_usage_stats``; lm-eval and others send
``add_special_tokens``, ``include_stop_str_in_output``...), and the official
SDKs send OpenAI's newer fields (``metadata``, ``store``, ``service_tier``,
``prompt_cache_key``...). vLLM accepts every field it knows and ignores unknown
ones with a logged warning. Here each of vLLM's fields gets one of three
answers, decided per field:

* **honoured** — declared on the mixins below and acted on by the server
  (``completions.py``, ``chat.py``, ``generation.py``, ``formatter.py``);
* **ignored** (``IGNORED``) — accepted with a warning in the server log,
  because doing nothing is what the field asks of this engine (there is one
  structured-output backend to pick, no multimodal processor to configure);
* **refused** (``REFUSED``) — a 400 that says why, because the field asks for
  an output this engine cannot give, and quietly giving another would be worse.

A field this server does not know at all — OpenAI's newer ones, another
server's, a misspelt one — is accepted and ignored, as vLLM does, and named in
the log the first time it is seen (``OpenAIModel``: ``extra="allow"``, then
``note_unknown_fields``). A field the server knows is still checked strictly:
a wrong type or value is a 400 naming it. ``docs/serving.md`` holds the same
decisions as a table; ``tests/serve/test_vllm_fields.py`` checks each one.
"""

from __future__ import annotations

import logging
from typing import Annotated, Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    StrictBool,
    StrictInt,
    StrictStr,
    ValidationInfo,
    model_validator,
)

from paged.sampling import SamplingParams
from paged.serve.errors import APIError

logger = logging.getLogger("paged.serve")

MAX_NOTED = 1024  # distinct ignored field names logged; a client choosing names cannot grow the set further
_noted: set[str] = set()


def note_ignored(field: str, why: str) -> None:
    """Log, once per server process, that ``field`` was accepted and ignored, and why."""
    field = field[:80]
    if field in _noted or len(_noted) >= MAX_NOTED:
        return
    _noted.add(field)
    logger.warning("request field ignored by this server: %s (%s)", field, why)


def unknown_fields(model: BaseModel, prefix: str = "") -> list[str]:
    """The dotted names of every field ``model`` and the models inside it accepted without knowing them
    (a model whose class sets ``note_extras = False`` is dropped whole, so its fields are not named)."""
    if not getattr(type(model), "note_extras", True):
        return []
    found = [prefix + str(k) for k in (model.model_extra or {})]
    for name in type(model).model_fields:
        value = getattr(model, name, None)
        items = value if isinstance(value, list) else [value]
        for i, item in enumerate(items):
            if isinstance(item, BaseModel):
                where = f"{prefix}{name}.{i}." if isinstance(value, list) else f"{prefix}{name}."
                found += unknown_fields(item, where)
    return found


class Items:
    """``Items[T]``: a request's list of ``T``, whose check stops at its first bad item.

    pydantic checks every item of a list and reports each failure; a 4 MiB body
    of 100 000 bad messages would cost seconds of a core to report 100 000
    errors, when the answer names only the first. Every list a request model
    holds is declared this way (``tests/serve/test_request_guard.py`` checks that no
    plain ``list[...]`` is left), so a bad body costs no more than its first bad
    item.
    """

    def __class_getitem__(cls, kind):
        return Annotated[list[kind], Field(fail_fast=True)]


def by_type(expected: str, other: type, **kinds: type) -> Discriminator:
    """Which member of a union an object is checked as, by its ``type``: ``kinds[type]`` when named there, else
    ``other`` (so a bad field of an object that says its type is that type's own error, never a list of every
    member's); a string is checked as the member tagged ``"str"``. Each member is tagged with its class name
    (``Tag``); a value no member could be (a number; a string where none is taken) is told ``expected``."""
    def member(value) -> str | None:
        if isinstance(value, str):
            return "str"
        if not isinstance(value, (dict, BaseModel)):
            return None
        kind = value.get("type") if isinstance(value, dict) else getattr(value, "type", None)
        return kinds.get(kind, other).__name__
    return Discriminator(member, custom_error_type="wrong_kind",
                         custom_error_message=f"Input should be {expected}")


class OpenAIModel(BaseModel):
    """A request object of the API: unknown fields accepted (and logged by the request), known ones strict."""

    model_config = ConfigDict(extra="allow")


BUILT_HERE = {"built_here": True}  # the validation context of a body the server wrote itself


class RequestModel(OpenAIModel):
    """A whole request body: after validation, each field it did not know is logged once (not in a body the
    server wrote itself from a checked request, validated with ``context=BUILT_HERE``: it has none, and the
    walk over 40 000 messages costs 0.6 s)."""

    @model_validator(mode="after")
    def _note_unknown(self, info: ValidationInfo):
        if info.context == BUILT_HERE:
            return self
        for field in unknown_fields(self):
            note_ignored(field, "unknown to this server")
        return self


def _bounds(**keywords) -> dict:
    """JSON-schema bounds for the document (enforced in the validators below)."""
    return {"json_schema_extra": keywords}


# accepted and logged: nothing here for them to change
IGNORED = {
    "guided_decoding_backend": "there is one structured-output backend (paged's own automaton)",
    "vllm_xargs": "no custom extensions read request arguments here",
    "mm_processor_kwargs": "the supported models take text only",
    "reasoning_effort": "the model decides how long it thinks; the template may read chat_template_kwargs",
    "metadata": "kept by nobody: the server stores no request",
    "service_tier": "one tier: every request is served the same way",
    "prompt_cache_key": "the prefix cache finds shared prompt blocks by their content, without a key",
    "safety_identifier": "the server keeps no per-user records",
    "store": "chat completions are not stored (the Responses API keeps its responses: previous_response_id)",
    "modalities": "text only",
    "verbosity": "the model decides how much it writes",
    "user": "the server keeps no per-user records",
}

# refused with a 400: each asks for an output this engine cannot give
REFUSED = {
    "structural_tag": "structured output takes a JSON schema, a JSON object, a regex, a choice or a grammar",
    "guided_whitespace_pattern": "the JSON automaton's whitespace is fixed",
    "logits_processors": "a request cannot load code into the server",
    "prompt_embeds": "prompts are text or token ids",
    "kv_transfer_params": "there is no disaggregated prefill here",
    "chat_template": "the chat template is the checkpoint's own; a request cannot replace it",
}
REFUSED_VALUES = {  # accepted at the default, refused otherwise
    "skip_special_tokens": (True, "the text always leaves special tokens out (their ids are in the logprobs)"),
    "spaces_between_special_tokens": (True, "special tokens are always skipped, so there are none to space"),
}


class _Extensions(RequestModel):
    """vLLM's fields that both endpoints take; those in ``IGNORED`` / ``REFUSED`` are declared untyped."""

    include_stop_str_in_output: StrictBool = False
    skip_special_tokens: StrictBool = True
    spaces_between_special_tokens: StrictBool = True
    truncate_prompt_tokens: StrictInt | None = Field(None, **_bounds(minimum=1))
    return_tokens_as_token_ids: StrictBool | None = None
    priority: StrictInt = 0  # the smaller goes first, with --scheduling-policy priority (the engine checks it)
    request_id: StrictStr | None = Field(None, **_bounds(minLength=1, maxLength=128))
    return_token_ids: StrictBool | None = Field(None, description="vLLM's: the prompt's and each choice's token "
                                                "ids with the text")

    guided_decoding_backend: Any = None
    vllm_xargs: Any = None
    mm_processor_kwargs: Any = None
    metadata: Any = None
    service_tier: Any = None
    prompt_cache_key: Any = None
    safety_identifier: Any = None
    store: Any = None
    modalities: Any = None
    verbosity: Any = None
    prompt_logprobs: StrictInt | None = Field(None, description="vLLM's: each prompt token's logprob and the most "
                                              "likely tokens there (not with stream)",
                                              **_bounds(minimum=0, maximum=SamplingParams.MAX_LOGPROBS))
    allowed_token_ids: Items[StrictInt] | None = Field(None, **_bounds(
        minItems=1, maxItems=SamplingParams.MAX_ALLOWED_TOKENS))
    structural_tag: Any = None
    guided_whitespace_pattern: Any = None
    logits_processors: Any = None
    cache_salt: StrictStr | None = Field(None, **_bounds(minLength=1, maxLength=SamplingParams.MAX_SALT_CHARS))
    kv_transfer_params: Any = None

    @model_validator(mode="after")
    def _extension_rules(self):
        given = self.model_fields_set
        for field, why in REFUSED.items():
            if field in given and getattr(self, field, None) is not None:
                raise APIError(f"{field} is not supported by this server: {why}", param=field,
                               code="unsupported_parameter")
        for field, (default, why) in REFUSED_VALUES.items():
            value = getattr(self, field, default)
            if value != default:
                raise APIError(f"{field} must be {str(default).lower() if isinstance(default, bool) else default} "
                               f"on this server ({why}), got {value!r}", param=field, code="unsupported_parameter")
        if self.prompt_logprobs is not None and getattr(self, "stream", False):  # vLLM's rule
            if self.prompt_logprobs:
                raise APIError("prompt_logprobs are not available with stream: true (they come with the whole "
                               "response)", param="prompt_logprobs", code="invalid_value")
            self.prompt_logprobs = None  # 0 with a stream asks for nothing
        if self.truncate_prompt_tokens is not None and self.truncate_prompt_tokens < 1:
            raise APIError(f"truncate_prompt_tokens must be >= 1, got {self.truncate_prompt_tokens}",
                           param="truncate_prompt_tokens", code="invalid_value")
        if self.request_id is not None and not 1 <= len(self.request_id) <= 128:
            raise APIError(f"request_id must have 1 to 128 characters, got {len(self.request_id)}",
                           param="request_id", code="invalid_value")
        for field in sorted(f for f in IGNORED if f in given and getattr(self, f, None) is not None):
            note_ignored(field, IGNORED[field])
        return self


class CompletionExtensions(_Extensions):
    """vLLM's extra fields of ``/v1/completions``."""

    add_special_tokens: StrictBool = True  # the tokenizer's BOS (if any) before a text prompt, as vLLM
    prompt_embeds: Any = None


class ChatExtensions(_Extensions):
    """vLLM's extra fields of ``/v1/chat/completions``."""

    add_special_tokens: StrictBool = False  # the template writes its own special tokens
    echo: StrictBool = False
    add_generation_prompt: StrictBool = True
    continue_final_message: StrictBool = False
    chat_template_kwargs: dict[str, Any] | None = None
    documents: Items[dict[str, Any]] | None = None
    chat_template: Any = None
    reasoning_effort: Any = None

    @model_validator(mode="after")
    def _chat_extension_rules(self):
        if self.continue_final_message and self.add_generation_prompt and \
                "add_generation_prompt" in self.model_fields_set:
            raise APIError("continue_final_message needs add_generation_prompt: false (the final message is "
                           "continued, so no new turn is opened)", param="continue_final_message")
        return self
