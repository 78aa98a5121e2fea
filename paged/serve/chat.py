"""Chat messages -> one prompt: the tokenizer's chat template, or a documented default.

A Hugging Face folder may carry a Jinja ``chat_template`` in
``tokenizer_config.json`` (a string, or a list of named templates of which
``default`` is used). It is rendered in Jinja's sandbox with ``messages``,
``add_generation_prompt=True``, ``bos_token`` and ``eos_token``, as
``transformers`` does, and the result is tokenized without adding special
tokens (the template writes its own).

Without a template (the demo model is a code-completion model and has none)
the default is plain text the tokenizer adds its usual BOS to::

    system: You are terse.
    user: Write add(a, b).
    assistant:
"""

from __future__ import annotations

import json
from pathlib import Path

DEFAULT_TEMPLATE_DOC = "one line per message, '<role>: <content>', then 'assistant:'"


def load_chat_template(model_path: str | Path) -> tuple[str | None, dict]:
    """The folder's chat template (or None) and its special tokens (``bos_token``, ``eos_token``)."""
    cfg_file = Path(model_path) / "tokenizer_config.json"
    if not cfg_file.is_file():
        return None, {}
    cfg = json.loads(cfg_file.read_text())
    template = cfg.get("chat_template")
    if isinstance(template, list):  # [{"name": ..., "template": ...}, ...]
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default")
    specials = {}
    for key in ("bos_token", "eos_token"):
        tok = cfg.get(key)
        specials[key] = tok.get("content", "") if isinstance(tok, dict) else (tok or "")
    return (template if isinstance(template, str) else None), specials


class ChatRenderer:
    """Renders chat messages into prompt token ids with one tokenizer.

    Args:
        tokenizer: a ``tokenizers.Tokenizer``.
        model_path: the checkpoint folder (read for ``tokenizer_config.json``).
    """

    def __init__(self, tokenizer, model_path: str | Path) -> None:
        self.tokenizer = tokenizer
        source, self.specials = load_chat_template(model_path)
        self.template = None
        if source is not None:
            from jinja2.sandbox import ImmutableSandboxedEnvironment  # jinja2 comes with torch

            env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
            env.globals["raise_exception"] = _raise_template_error
            self.template = env.from_string(source)

    @property
    def kind(self) -> str:
        return "the tokenizer's chat template" if self.template is not None else f"default ({DEFAULT_TEMPLATE_DOC})"

    def render(self, messages: list[dict]) -> str:
        """The prompt text for ``messages`` (each ``{"role", "content"}`` with text content)."""
        if self.template is not None:
            return self.template.render(messages=messages, add_generation_prompt=True, **self.specials)
        return "".join(f"{m['role']}: {m['content']}\n" for m in messages) + "assistant:"

    def encode(self, messages: list[dict]) -> tuple[str, list[int]]:
        """Prompt text and token ids; a template's own special tokens are not doubled."""
        text = self.render(messages)
        ids = self.tokenizer.encode(text, add_special_tokens=self.template is None).ids
        return text, ids


class TemplateError(ValueError):
    """The chat template refused the messages (``raise_exception`` in the template)."""


def _raise_template_error(message: str):
    raise TemplateError(f"the chat template refused the messages: {message}")
