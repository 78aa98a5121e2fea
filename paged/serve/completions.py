"""``POST /v1/completions``: prompts (text or token ids) -> one engine request each -> text completions.

The path of a request, in order: the body is parsed (``body.py``) into a
``CompletionRequest`` (``protocol.py``); the model name is checked
(``models.py``); each prompt becomes token ids (text is tokenized, with the
tokenizer's BOS when ``add_special_tokens``; ``truncate_prompt_tokens`` keeps
the last ones); then ``generation.py`` checks the context, submits, and streams
or collects. ``echo`` puts each prompt's text before its completion (with
``logprobs``, the prompt's logprobs too, computed during prefill).
"""

from __future__ import annotations

from fastapi import Request
from fastapi.responses import Response

from paged.serve.body import parse_body
from paged.serve.errors import APIError
from paged.serve.generation import Generator
from paged.serve.models import ServedModel
from paged.serve.openapi import generation_route
from paged.serve.protocol import CompletionRequest
from paged.serve.schemas import CompletionChunk, CompletionResponse


def install(app, served: ServedModel, generator: Generator) -> None:
    """Add ``POST /v1/completions`` to ``app``."""

    @app.post("/v1/completions", summary="Complete prompts",
              **generation_route(CompletionRequest, CompletionResponse, CompletionChunk))
    async def completions(raw: Request):
        return await complete(await parse_body(raw, CompletionRequest, served.work), raw, served, generator)


async def complete(req: CompletionRequest, raw: Request, served: ServedModel, generator: Generator) -> Response:
    """Answer one parsed completions request (the stream, or the whole response)."""
    served.check(req.model)
    sent = req.prompts()  # each a text or token ids
    texts = [p for p in sent if isinstance(p, str)]
    if texts and served.tokenizer is None:
        raise APIError("this model has no tokenizer.json: send prompt as token ids", param="prompt")
    encoded = iter(await served.encode(texts, req.add_special_tokens) if texts else [])
    ids = [next(encoded) if isinstance(p, str) else p for p in sent]
    prompts = [p if isinstance(p, str) else None for p in sent]
    for i, one in enumerate(ids):
        if req.truncate_prompt_tokens is not None and len(one) > req.truncate_prompt_tokens:
            ids[i], prompts[i] = one[-req.truncate_prompt_tokens:], None  # the last ones, as vLLM keeps
    # the engine's prompt logprobs: for echo with logprobs, and for vLLM's prompt_logprobs (the larger of the two)
    asked = [k for k in (req.logprobs if req.echo else None, req.prompt_logprobs) if k is not None]
    prompt_logprobs = max(asked) if asked else None
    rename = req.guided_rename()

    async def prompt_texts() -> list[str]:  # a token-id prompt decoded (skipping special tokens), a text one as sent
        if served.tokenizer is None:
            return [p if p is not None else "" for p in prompts]
        decoded = iter(await served.decode([i for p, i in zip(prompts, ids) if p is None], True))
        return [p if p is not None else next(decoded) for p in prompts]

    # decoded only once the engine has accepted the ids (an id out of the vocabulary is a 400)
    return await generator.run(req, raw, "completion", ids, prompts, req.max_tokens, req.logprobs, rename,
                               prompt_logprobs, echo=prompt_texts if req.echo else None)
