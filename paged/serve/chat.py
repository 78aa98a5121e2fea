"""``POST /v1/chat/completions``: messages -> one prompt (the model's chat template) -> one engine request.

The path of a request, in order: the body is parsed (``body.py``) into a
``ChatCompletionRequest`` (``chat_protocol.py``); the model name is checked
(``models.py``); the tool choice is read (``tools.py``: a forced call becomes a
JSON schema on the output); the messages and tools are rendered with the
checkpoint's chat template and tokenized (``chat_template.py``); the template's
end-of-turn token joins the stop tokens, so a reply ends where the template's
turn would; then ``generation.py`` checks the context, submits, and streams or
collects, each reply split by a ``ChatParser`` (``chat_output.py``) into
reasoning, content and tool calls when the server has a reasoning parser or
the request has tools to call.

Chat spells some fields its own way, and errors name the field the client
sent: ``messages`` (the engine's ``prompt``), ``top_logprobs`` (``logprobs``),
``max_completion_tokens`` or ``max_tokens``.
"""

from __future__ import annotations

from fastapi import Request

from paged.serve.body import parse_body
from paged.serve.chat_protocol import ChatCompletionRequest
from paged.serve.errors import APIError
from paged.serve.generation import Generator, client_address
from paged.serve.models import ServedModel
from paged.serve.openapi import generation_route
from paged.serve.schemas import ChatCompletionChunk, ChatCompletionResponse
from paged.serve.tools import plan_tools


def install(app, served: ServedModel, generator: Generator) -> None:
    """Add ``POST /v1/chat/completions`` to ``app``."""

    @app.post("/v1/chat/completions", summary="Answer a conversation",
              **generation_route(ChatCompletionRequest, ChatCompletionResponse, ChatCompletionChunk))
    async def chat_completions(raw: Request):
        return await answer(await parse_body(raw, ChatCompletionRequest, served.work), raw, served, generator)


def template_variables(req: ChatCompletionRequest) -> dict:
    """``chat_template_kwargs`` and ``documents``: extra variables the chat template may read."""
    variables = dict(req.chat_template_kwargs or {})
    if req.documents is not None:
        variables["documents"] = req.documents
    return variables


async def render(req: ChatCompletionRequest, served: ServedModel):
    """The prompt a chat request makes: ``(plan, messages, text, ids)``, its tool plan (a forced call's schema
    set on ``req``), the messages as the template takes them, and the rendered text and token ids."""
    served.check(req.model)
    if served.chat is None:
        raise APIError(f"{served.no_chat}; use /v1/completions instead", param="messages",
                       code="chat_template_missing")
    plan, functions = plan_tools(req, served.options.auto_parser)
    schema = plan.schema(functions)
    if schema is not None:
        req.force_json("tool_choice", schema)
    messages = await served.work.run(len(req.messages), req.template_messages)
    text, ids = await served.render_chat(messages, req.add_generation_prompt, req.continue_final_message,
                                         req.add_special_tokens, template_variables(req), plan.tools)
    if req.truncate_prompt_tokens is not None and len(ids) > req.truncate_prompt_tokens:
        text, ids = None, ids[-req.truncate_prompt_tokens:]
    return plan, messages, text, ids


def field_names(req: ChatCompletionRequest) -> dict[str, str]:
    """The engine's field names -> the chat request's, for its errors (``max_tokens`` is the one it sent)."""
    name = "max_completion_tokens" if req.max_completion_tokens is not None else "max_tokens"
    return {"prompt": "messages", "logprobs": "top_logprobs", "max_tokens": name, **req.guided_rename()}


async def answer(req: ChatCompletionRequest, raw: Request, served: ServedModel, generator: Generator,
                 start_only: bool = False, tag: str | None = None):
    """Answer one parsed chat request (the stream, or the whole response); ``start_only``: submit it and
    return the ``generation.Run`` (the Responses API answers it its own way, its engine ids ``tag``)."""
    plan, messages, text, ids = await render(req, served)
    # vLLM's chat echo: a reply that continues the last message (same role) starts with that message
    echo = [messages[-1]["content"]] if req.echo and messages[-1]["role"] == "assistant" else None
    max_tokens = req.requested_max_tokens
    if max_tokens is None:  # OpenAI's default for chat: whatever context is left
        max_tokens = max(1, served.max_model_len - len(ids))
    parse = served.options.chat_parser(plan, req.include_reasoning, req.wants_grammar)
    args = (req, "chat", [ids], [text], max_tokens, req.num_logprobs, field_names(req))
    keywords = dict(echo=echo, stop_token_ids=served.chat.end_of_turn_ids, parse=parse,
                    prompt_logprobs=req.prompt_logprobs)
    if start_only:
        return await generator.start(*args, **keywords, tag=tag, client=client_address(raw))
    return await generator.run(req, raw, *args[1:], **keywords)
