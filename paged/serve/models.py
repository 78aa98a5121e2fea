"""The served model: ``GET /v1/models``, ``GET /v1/models/{name}``, and what every endpoint asks of it.

A server serves one model under one name (``--served-model-name``). Every
endpoint that takes a ``model`` field checks it here (another name is a 404
naming the served one), and reads from here the model's tokenizer, its chat
renderer (``chat_template.py``; None when the checkpoint has no template or no
tokenizer, with the reason in ``no_chat``) and its context length. Chat and
``/tokenize`` render messages through ``render_chat``, so both count the same
tokens. Tokenizing, detokenizing and rendering go through ``offload.py``: a
client chooses how large they are, so they never run on the event loop when
they are large.

``GET /v1/models`` names the model as it is served (``--served-model-name``);
its ``root`` is that name too, never the checkpoint's path on this machine.
"""

from __future__ import annotations

import time

from paged.serve import offload
from paged.serve.chat_template import ChatRenderer
from paged.serve.errors import APIError
from paged.serve.openapi import error_responses
from paged.serve.options import ServeOptions
from paged.serve.schemas import ModelCard, ModelList


class ServedModel:
    """The one model of this server, as clients see it.

    Args:
        llm: the ``LLM`` (``.tokenizer``, ``.model``: the ``LoadedModel``, ``.engine.max_model_len``).
        name: the name clients must send as ``model``.
        work: the ``Offload`` pool large tokenizations run on.
    """

    def __init__(self, llm, name: str, work: offload.Offload, options: ServeOptions | None = None) -> None:
        self.name = name
        self.options = options or ServeOptions()
        self.names = [name, *(n for n in self.options.extra_model_names if n != name)]
        self.created = int(time.time())
        self.work = work
        self.tokenizer = llm.tokenizer
        self.chat_template = llm.model.chat_template
        self.special_tokens = llm.model.special_tokens
        self.max_model_len = llm.engine.max_model_len
        self.block_size = llm.engine.block_size
        self.prefix_caching = bool(getattr(llm.engine, "enable_prefix_caching", False))
        self.chat, self.no_chat = None, None
        if self.tokenizer is None:
            self.no_chat = "this model has no tokenizer, so chat messages cannot be rendered"
        elif self.chat_template is None:
            self.no_chat = "this model has no chat template, so there is no chat format to render messages in"
        else:
            self.chat = ChatRenderer(self.tokenizer, self.chat_template, self.special_tokens)

    def check(self, model: str | None) -> None:
        """A request's ``model`` field: absent, or this server's name (else a 404 naming it)."""
        if model is not None and model not in self.names:
            raise APIError(f"model {model!r} does not exist; this server serves {self.name!r} "
                           "(GET /v1/models)", 404, param="model", code="model_not_found")

    async def encode(self, texts: list[str], add_special_tokens: bool) -> list[list[int]]:
        """The token ids of each text (the tokenizer must exist)."""
        def run() -> list[list[int]]:
            return [offload.encode(self.tokenizer, t, add_special_tokens) for t in texts]
        return await self.work.run(sum(map(len, texts)), run)

    async def decode(self, ids: list[list[int]], skip_special_tokens: bool) -> list[str]:
        """The text of each token-id list (the tokenizer must exist)."""
        def run() -> list[str]:
            return [offload.decode(self.tokenizer, one, skip_special_tokens) for one in ids]
        return await self.work.run(sum(map(len, ids)), run)

    async def render_chat(self, messages: list[dict], add_generation_prompt: bool, continue_final_message: bool,
                          add_special_tokens: bool, variables: dict | None,
                          tools: list[dict] | None = None) -> tuple[str, list[int]]:
        """The prompt text and ids of ``messages`` (``{"role", "content"}`` dicts, and an assistant's
        ``tool_calls``) and ``tools`` in this model's chat template (``self.chat`` must exist); a
        template's refusal is a 400 naming ``messages``."""
        def run() -> tuple[str, list[int]]:
            return self.chat.encode(messages, add_generation_prompt and not continue_final_message,
                                    continue_final_message, add_special_tokens, variables, tools)
        size = sum(len(m["content"]) + len(str(m.get("tool_calls", ""))) for m in messages) + len(str(tools or ""))
        try:
            return await self.work.run(size, run)
        except ValueError as e:
            raise APIError(str(e), param="messages") from None

    def card(self, name: str | None = None) -> ModelCard:
        name = name or self.name
        return ModelCard(id=name, created=self.created, owned_by="paged", root=self.name,
                         max_model_len=self.max_model_len)


def install(app, served: ServedModel) -> None:
    """Add ``GET /v1/models`` and ``GET /v1/models/{name}`` to ``app``."""

    @app.get("/v1/models", tags=["OpenAI API"], summary="The served model", responses=error_responses(401))
    async def models() -> ModelList:
        return ModelList(data=[served.card(name) for name in served.names])

    @app.get("/v1/models/{model:path}", tags=["OpenAI API"], summary="One model, by name",
             responses=error_responses(401, _404="no model of that name"))
    async def model(model: str) -> ModelCard:
        served.check(model)
        return served.card(model)
