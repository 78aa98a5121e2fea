"""Chat messages (and tools) -> one prompt, with the model's own Jinja chat template.

The template comes with the checkpoint (``LoadedModel.chat_template``: a
folder's ``chat_template.jinja`` / ``tokenizer_config.json`` / ..., see
``paged.models.chat_template``, or a GGUF file's ``tokenizer.chat_template``).
It is rendered as transformers' ``apply_chat_template`` renders it: Jinja's
sandbox with ``trim_blocks`` and ``lstrip_blocks``, loop controls, a
``tojson`` that keeps non-ASCII text, ``raise_exception`` and
``strftime_now``; the variables are ``messages``, ``add_generation_prompt``,
``bos_token``, ``eos_token`` and, when a request declares functions, ``tools``
(each as OpenAI sends it, ``{"type": "function", "function": {...}}``, as
transformers passes them). The text is then tokenized without adding special
tokens, because the template writes its own.

Tool calls in the history: a template that knows them (it reads
``tool_calls``) gets each assistant message's calls, their arguments as objects.
A template that does not (SmolLM2's, the demo model's) would drop them, so the
model would never see what it called: for those the calls are written into the
message's content as Hermes blocks, ``<tool_call>{"name", "arguments"}</tool_call>``.

The end of an assistant turn is found by rendering a sample conversation:
whatever the template writes right after an assistant message (ChatML's
``<|im_end|>``, Llama 3's ``<|eot_id|>``) is, when it is one special token,
a stop token for every chat request, so a reply ends where the template's
turn would end even if the model's EOS id is another token.

A model without a template has no chat format to follow: ``ChatRenderer``
is then not built, and the server answers chat requests with a 400 that
says so (``/v1/completions`` still works).
"""

from __future__ import annotations

import datetime
import json

_SENTINEL = "\x00paged-end-of-turn-probe\x00"


class TemplateError(ValueError):
    """The chat template refused the messages (``raise_exception`` in the template)."""


def _raise_template_error(message: str):
    raise TemplateError(f"the chat template refused the messages: {message}")


def _tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False) -> str:
    """Jinja's ``tojson`` without its HTML escaping, as chat templates expect."""
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.datetime.now().strftime(fmt)


def encode(tokenizer, text: str, add_special_tokens: bool) -> list[int]:
    """``tokenizer.encode(text).ids`` through the batch call, which lets go of the GIL (it may run on a thread)."""
    return tokenizer.encode_batch([text], add_special_tokens=add_special_tokens)[0].ids


def hermes_calls(calls: list[dict]) -> str:
    """Tool calls written as Hermes blocks, for a template that has no place for them."""
    return "".join("<tool_call>" + json.dumps({"name": c["function"]["name"], "arguments": c["function"]["arguments"]},
                                               ensure_ascii=False) + "</tool_call>" for c in calls)


def compile_template(source: str):
    """A Jinja ``Template`` for ``source`` in the environment transformers renders chat templates in."""
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment  # jinja2 comes with torch

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_template_error
    env.globals["strftime_now"] = _strftime_now
    return env.from_string(source)


class ChatRenderer:
    """Renders chat messages into prompt token ids with one tokenizer and one template.

    Args:
        tokenizer: a ``tokenizers.Tokenizer``.
        template: the Jinja source of the chat template.
        special_tokens: ``{"bos_token": ..., "eos_token": ...}`` strings the template may print.
    """

    def __init__(self, tokenizer, template: str, special_tokens: dict | None = None) -> None:
        self.tokenizer = tokenizer
        self.specials = {"bos_token": "", "eos_token": "", **(special_tokens or {})}
        self.template = compile_template(template)
        self.knows_tool_calls = "tool_calls" in template
        self.end_of_turn_ids = self._end_of_turn_ids()

    def render(self, messages: list[dict], add_generation_prompt: bool = True,
               variables: dict | None = None, tools: list[dict] | None = None) -> str:
        """The prompt text for ``messages`` (each ``{"role", "content"}`` with text content, and an
        assistant's ``tool_calls``) and ``tools`` (None: the template's ``tools`` is undefined).

        ``variables`` (a request's ``chat_template_kwargs``) are extra names the template may read;
        ``messages``, ``tools``, ``add_generation_prompt`` and the special tokens are always this call's own.
        """
        if not self.knows_tool_calls:
            messages = [{**m, "content": (m.get("content") or "") + hermes_calls(m["tool_calls"])}
                        if m.get("tool_calls") else m for m in messages]
        own = {"tools": tools} if tools else {}
        return self.template.render({**(variables or {}), "messages": messages, **own,
                                     "add_generation_prompt": add_generation_prompt, **self.specials})

    def encode(self, messages: list[dict], add_generation_prompt: bool = True, continue_final_message: bool = False,
               add_special_tokens: bool = False, variables: dict | None = None,
               tools: list[dict] | None = None) -> tuple[str, list[int]]:
        """Prompt text and token ids; the template's own special tokens are not doubled.

        ``continue_final_message``: the text ends right after the last message's content, with no
        end-of-turn token, so the model carries on that message (a prefilled reply).
        ``add_special_tokens``: the tokenizer's own (a BOS) on top of the template's, as vLLM's field.
        """
        text = self.render(messages, add_generation_prompt, variables, tools)
        if continue_final_message:
            final = messages[-1]["content"]
            end = text.rfind(final) if final else -1
            if end < 0 and final.strip():
                final = final.strip()
                end = text.rfind(final)
            if end < 0:
                raise TemplateError("continue_final_message: the chat template does not write the final "
                                    "message's content as given, so there is no end of it to continue from")
            text = text[:end + len(final)]
        return text, encode(self.tokenizer, text, add_special_tokens)

    def _end_of_turn_ids(self) -> list[int]:
        """The special token the template writes right after an assistant message, as ``[id]`` (else ``[]``)."""
        probe = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": _SENTINEL}]
        try:
            text = self.render(probe, add_generation_prompt=False)
        except Exception:  # a template that refuses this probe conversation simply gives no stop token
            return []
        after = text.partition(_SENTINEL)[2]
        if not after:
            return []
        first = self.tokenizer.encode(after, add_special_tokens=False)
        if not first.ids:
            return []
        token_id = first.ids[0]
        is_special = self.tokenizer.decode([token_id], skip_special_tokens=True) == ""
        return [token_id] if is_special else []
