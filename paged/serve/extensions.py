"""vLLM's extensions to OpenAI's request bodies, field by field: honoured, ignored with a warning, or refused.

A user switching from vLLM points the same clients at this server, and those
clients send vLLM's extra fields (guidellm always sends
``stream_options.continuous_usage_stats``; lm-eval and others send
``add_special_tokens``, ``include_stop_str_in_output``...). vLLM accepts every
field it knows and ignores unknown ones with a logged warning. Here each of
vLLM's fields gets one of three answers, decided per field:

* **honoured** — declared on the mixins below and acted on by the server
  (``completions.py``, ``chat.py``, ``generation.py``, ``formatter.py``);
* **ignored** (``IGNORED``) — accepted with a warning in the server log,
  because doing nothing is what the field asks of this engine (there is one
  structured-output backend to pick, no multimodal processor to configure);
* **refused** (``REFUSED``) — a 400 that says why, because the field asks for
  an output this engine cannot give, and quietly giving another would be worse.

Fields that neither vLLM nor OpenAI define stay a 400 (``extra="forbid"``),
so a misspelt field is still caught. ``docs/serving.md`` holds the same
decisions as a table; ``tests/serve/test_extensions.py`` checks the two agree.
"""

from __future__ import annotations

import logging
from typing import Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    StrictStr,
    model_validator,
)

from paged.serve.errors import APIError

logger = logging.getLogger("paged.serve")


def _bounds(**keywords) -> dict:
    """JSON-schema bounds for the document (enforced in the validators below)."""
    return {"json_schema_extra": keywords}


# accepted and logged: nothing here for them to change
IGNORED = {
    "guided_decoding_backend": "there is one structured-output backend (paged's own automaton)",
    "vllm_xargs": "no custom extensions read request arguments here",
    "mm_processor_kwargs": "the supported models take text only",
    "parallel_tool_calls": "tools are not supported (and `tools` itself is refused)",
    "reasoning_effort": "no reasoning parser: the reply is plain content",
    "include_reasoning": "no reasoning parser: the reply is plain content",
}

# refused with a 400: each asks for an output this engine cannot give
REFUSED = {
    "prompt_logprobs": "the prompt's logprobs come with echo: true and logprobs on /v1/completions",
    "allowed_token_ids": "restricting the vocabulary is not implemented; logit_bias or guided_choice may do",
    "guided_grammar": "structured output takes a JSON schema, a JSON object, a regex or a choice, not a grammar",
    "structural_tag": "structured output takes a JSON schema, a JSON object, a regex or a choice",
    "guided_whitespace_pattern": "the JSON automaton's whitespace is fixed",
    "logits_processors": "a request cannot load code into the server",
    "cache_salt": "the prefix cache is not salted, so a salt would promise an isolation it does not give",
    "prompt_embeds": "prompts are text or token ids",
    "kv_transfer_params": "there is no disaggregated prefill here",
    "chat_template": "the chat template is the checkpoint's own; a request cannot replace it",
}
REFUSED_VALUES = {  # accepted at the default, refused otherwise
    "skip_special_tokens": (True, "the text always leaves special tokens out (their ids are in the logprobs)"),
    "spaces_between_special_tokens": (True, "special tokens are always skipped, so there are none to space"),
    "priority": (0, "the scheduler is first-come first-served (the paper's policy); only priority 0 exists"),
}


class _Extensions(BaseModel):
    """vLLM's fields that both endpoints take; those in ``IGNORED`` / ``REFUSED`` are declared untyped."""

    model_config = ConfigDict(extra="forbid")

    include_stop_str_in_output: StrictBool = False
    skip_special_tokens: StrictBool = True
    spaces_between_special_tokens: StrictBool = True
    truncate_prompt_tokens: StrictInt | None = Field(None, **_bounds(minimum=1))
    return_tokens_as_token_ids: StrictBool | None = None
    priority: StrictInt = 0
    request_id: StrictStr | None = Field(None, **_bounds(minLength=1, maxLength=128))

    guided_decoding_backend: Any = None
    vllm_xargs: Any = None
    mm_processor_kwargs: Any = None
    prompt_logprobs: Any = None
    allowed_token_ids: Any = None
    guided_grammar: Any = None
    structural_tag: Any = None
    guided_whitespace_pattern: Any = None
    logits_processors: Any = None
    cache_salt: Any = None
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
        if self.truncate_prompt_tokens is not None and self.truncate_prompt_tokens < 1:
            raise APIError(f"truncate_prompt_tokens must be >= 1, got {self.truncate_prompt_tokens}",
                           param="truncate_prompt_tokens", code="invalid_value")
        if self.request_id is not None and not 1 <= len(self.request_id) <= 128:
            raise APIError(f"request_id must have 1 to 128 characters, got {len(self.request_id)}",
                           param="request_id", code="invalid_value")
        ignored = sorted(f for f in IGNORED if f in given and getattr(self, f, None) is not None)
        if ignored:
            logger.warning("request fields ignored by this server: %s",
                           "; ".join(f"{f} ({IGNORED[f]})" for f in ignored))
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
    documents: list[dict[str, Any]] | None = None
    chat_template: Any = None
    parallel_tool_calls: Any = None
    reasoning_effort: Any = None
    include_reasoning: Any = None

    @model_validator(mode="after")
    def _chat_extension_rules(self):
        if self.continue_final_message and self.add_generation_prompt and \
                "add_generation_prompt" in self.model_fields_set:
            raise APIError("continue_final_message needs add_generation_prompt: false (the final message is "
                           "continued, so no new turn is opened)", param="continue_final_message")
        return self
