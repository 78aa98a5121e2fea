"""The tokenizer over HTTP, in vLLM's shapes: ``POST /tokenize``, ``POST /detokenize``, ``GET /tokenizer_info``.

Clients use them to count tokens without generating (guidellm, prompt
budgeting) or, like lm-eval's ``tokenizer_backend=remote``, as their whole
tokenizer: ``/tokenizer_info`` gives the special tokens and the chat template,
``/tokenize`` and ``/detokenize`` do the rest. They never reach the engine.

``/tokenize`` takes either a completion prompt (``prompt``, special tokens
added by default, as ``/v1/completions`` adds them) or chat ``messages``
(rendered by the same ``ChatRenderer`` as ``/v1/chat/completions``, so the
count is exactly that endpoint's ``usage.prompt_tokens``).

A body may hold megabytes of text, so tokenizing, the token strings and the
answer's JSON are computed off the event loop (``offload.py``) when large.
"""

from __future__ import annotations

from typing import Any

from fastapi import Request
from fastapi.responses import Response
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    StrictStr,
    model_validator,
)

from paged.serve import offload
from paged.serve.body import parse_body
from paged.serve.errors import APIError
from paged.serve.extensions import Items
from paged.serve.openapi import COMPONENTS, error_responses
from paged.serve.chat_protocol import MAX_TOOLS, ChatMessage, Tool


class TokenizeCompletionRequest(BaseModel):
    """``POST /tokenize`` with a prompt."""

    model_config = ConfigDict(extra="forbid")
    model: StrictStr | None = None
    prompt: StrictStr
    add_special_tokens: StrictBool = True
    return_token_strs: StrictBool = False


class TokenizeChatRequest(BaseModel):
    """``POST /tokenize`` with chat messages, rendered as ``/v1/chat/completions`` renders them."""

    model_config = ConfigDict(extra="forbid")
    model: StrictStr | None = None
    messages: Items[ChatMessage] = Field(min_length=1)
    add_generation_prompt: StrictBool = True
    continue_final_message: StrictBool = False
    add_special_tokens: StrictBool = False
    return_token_strs: StrictBool = False
    chat_template_kwargs: dict[str, Any] | None = None
    tools: Items[Tool] | None = Field(None, max_length=MAX_TOOLS, description="the functions the template lists, as "
                                     "/v1/chat/completions passes them")

    @model_validator(mode="after")
    def _one_ending(self):
        if self.continue_final_message and self.add_generation_prompt and \
                "add_generation_prompt" in self.model_fields_set:
            raise APIError("continue_final_message needs add_generation_prompt: false", param="continue_final_message")
        return self


TEXTS_PER_CALL = 16_384  # token texts decoded per tokenizer call: the GIL changes hands between calls


def token_texts(tok, ids: list[int]) -> list[str]:
    """Each token's text, in batch calls of ``TEXTS_PER_CALL``: one call over a 3 MB prompt's 1.3 M tokens
    held the GIL for its whole argument and result conversion and stalled every stream 1.3 s."""
    texts: list[str] = []
    for start in range(0, len(ids), TEXTS_PER_CALL):
        texts += tok.decode_batch([[t] for t in ids[start:start + TEXTS_PER_CALL]], skip_special_tokens=False)
    return texts


class TokenizeResponse(BaseModel):
    count: int = Field(ge=0)
    max_model_len: int = Field(ge=1)
    tokens: list[int]
    token_strs: list[str] | None = None


class DetokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    model: StrictStr | None = None
    tokens: Items[StrictInt]


class DetokenizeResponse(BaseModel):
    prompt: str


class TokenizerInfo(BaseModel):
    """What a client needs to tokenize as the server does (the fields of a ``tokenizer_config.json``)."""

    tokenizer_class: str
    bos_token: str | None = None
    eos_token: str | None = None
    pad_token: str | None = None
    chat_template: str | None = None
    model_max_length: int = Field(ge=1)
    vocab_size: int = Field(ge=0)


class TokenizeRequest:
    """Either body of ``POST /tokenize``: ``messages`` picks the chat one (as vLLM's union does)."""

    models = (TokenizeCompletionRequest, TokenizeChatRequest)

    @staticmethod
    def model_validate(data: dict) -> TokenizeCompletionRequest | TokenizeChatRequest:
        return (TokenizeChatRequest if "messages" in data else TokenizeCompletionRequest).model_validate(data)


# the request models whose schemas the published document carries (``openapi.install``)
REQUEST_MODELS = [TokenizeCompletionRequest, TokenizeChatRequest, DetokenizeRequest]
EXAMPLES = {
    "tokenize": {"prompt": {"prompt": "def fib(n):"},
                 "chat": {"messages": [{"role": "user", "content": "Hello"}], "return_token_strs": True}},
    "detokenize": {"ids": {"tokens": [5, 6, 7]}, "one": {"tokens": [42]}},
}


def _body(route: str, *models) -> dict:
    """``openapi_extra`` for a tokenizer route: its request shapes (one, or either of two) and examples."""
    refs = [{"$ref": COMPONENTS + m.__name__} for m in models]
    return {"requestBody": {"required": True, "content": {"application/json": {
        "schema": refs[0] if len(refs) == 1 else {"anyOf": refs},
        "examples": {name: {"value": v} for name, v in EXAMPLES[route].items()}}}}}


def install(app, served) -> None:
    """Add the three routes to ``app``; ``served`` is the ``ServedModel`` (its tokenizer, chat renderer,
    special tokens, chat template, name and context length)."""

    def tokenizer():
        if served.tokenizer is None:
            raise APIError("this model has no tokenizer.json, so there is no tokenizer to serve", 404,
                           code="tokenizer_missing")
        return served.tokenizer

    def check_ids(ids: list[int]) -> None:
        vocab = tokenizer().get_vocab_size(with_added_tokens=True)
        bad = [t for t in ids if not 0 <= t < vocab]
        if bad:
            raise APIError(f"tokens: ids must be in [0, {vocab}) for this tokenizer, got {bad[:5]}",
                           param="tokens", code="invalid_value")

    async def json_off_loop(size: int, answer) -> Response:
        """``answer()`` (a response model) serialized on the offload pool when ``size`` is large."""
        body = await served.work.run(size, lambda: answer().model_dump_json())
        return Response(body, media_type="application/json")

    errors = error_responses(400, 401, 413, _404="no model of that name, or the model has no tokenizer")

    @app.post("/tokenize", tags=["tokenizer"], summary="Token ids of a prompt or of chat messages",
              openapi_extra=_body("tokenize", *TokenizeRequest.models), responses=errors)
    async def tokenize(raw: Request) -> TokenizeResponse:
        req = await parse_body(raw, TokenizeRequest, served.work)
        served.check(req.model)
        tok = tokenizer()
        if isinstance(req, TokenizeChatRequest):
            if served.chat is None:
                raise APIError(served.no_chat, param="messages", code="chat_template_missing")
            messages = [m.for_template() for m in req.messages]
            tools = [t.model_dump(exclude_none=True) for t in req.tools or []] or None
            _, ids = await served.render_chat(messages, req.add_generation_prompt, req.continue_final_message,
                                              req.add_special_tokens, req.chat_template_kwargs, tools)
        else:
            (ids,) = await served.encode([req.prompt], req.add_special_tokens)

        def answer() -> TokenizeResponse:
            strs = token_texts(tok, ids) if req.return_token_strs else None
            return TokenizeResponse(count=len(ids), max_model_len=served.max_model_len, tokens=ids, token_strs=strs)
        return await json_off_loop(len(ids), answer)

    @app.post("/detokenize", tags=["tokenizer"], summary="The text of token ids",
              openapi_extra=_body("detokenize", DetokenizeRequest), responses=errors)
    async def detokenize(raw: Request) -> DetokenizeResponse:
        req = await parse_body(raw, DetokenizeRequest, served.work)
        served.check(req.model)
        tokenizer()

        def answer() -> DetokenizeResponse:
            check_ids(req.tokens)
            return DetokenizeResponse(prompt=offload.decode(served.tokenizer, req.tokens, False))
        return await json_off_loop(len(req.tokens), answer)

    @app.get("/tokenizer_info", tags=["tokenizer"], summary="The tokenizer's special tokens and chat template",
             responses=error_responses(401, _404="the model has no tokenizer"))
    async def tokenizer_info() -> TokenizerInfo:
        tok, specials = tokenizer(), served.special_tokens or {}
        return TokenizerInfo(tokenizer_class="PreTrainedTokenizerFast", bos_token=specials.get("bos_token") or None,
                             eos_token=specials.get("eos_token") or None, pad_token=specials.get("pad_token") or None,
                             chat_template=served.chat_template, model_max_length=served.max_model_len,
                             vocab_size=tok.get_vocab_size(with_added_tokens=True))
