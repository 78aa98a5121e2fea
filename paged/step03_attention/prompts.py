"""vLLM's offline inputs: prompt dicts (``TextPrompt``, ``TokensPrompt``), ``BeamSearchParams``, the tokenizer.

A program written for ``vllm.LLM`` passes prompts as strings, token-id lists, or
dicts (``{"prompt": ...}``, ``{"prompt_token_ids": [...]}``), and reads the
model's tokenizer with ``llm.get_tokenizer()`` as a transformers tokenizer
(``encode`` gives a list, ``decode`` a string, ``apply_chat_template``
renders). ``LLM`` (``llm.py``) takes all of these; this module holds their
shapes and ``Tokenizer``, a thin transformers-style face over the checkpoint's
``tokenizers.Tokenizer``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypedDict

from typing_extensions import NotRequired


class TextPrompt(TypedDict):
    """A prompt as text (vLLM's ``TextPrompt``)."""

    prompt: str
    multi_modal_data: NotRequired[dict]


class TokensPrompt(TypedDict):
    """A prompt as token ids (vLLM's ``TokensPrompt``)."""

    prompt_token_ids: list[int]
    prompt: NotRequired[str]


@dataclass
class BeamSearchParams:
    """``LLM.beam_search``'s settings (vLLM's ``BeamSearchParams``).

    Attributes:
        beam_width: beams kept after each step, and sequences returned.
        max_tokens: most tokens per beam.
        ignore_eos: keep extending past the end-of-sequence token.
        temperature: must be 0: beams are ranked by their model logprobs.
        length_penalty: the ranking's length exponent.
        include_stop_str_in_output: accepted (beam search has no stop strings).
    """

    beam_width: int
    max_tokens: int
    ignore_eos: bool = False
    temperature: float = 0.0
    length_penalty: float = 1.0
    include_stop_str_in_output: bool = False


def split_prompt(prompt, encode) -> tuple[str | None, list[int]]:
    """``(text or None, token ids)`` of one prompt in any of the accepted forms; ``encode`` tokenizes text."""
    if isinstance(prompt, str):
        return prompt, encode(prompt)
    if isinstance(prompt, dict):
        if "prompt_token_ids" in prompt:
            return prompt.get("prompt"), list(prompt["prompt_token_ids"])
        if "prompt" in prompt:
            return prompt["prompt"], encode(prompt["prompt"])
        raise ValueError(f"a prompt dict needs 'prompt' or 'prompt_token_ids', got keys {sorted(prompt)}")
    if isinstance(prompt, (list, tuple)) and all(isinstance(t, int) for t in prompt):
        return None, list(prompt)
    raise ValueError(f"a prompt is a string, a list of token ids or a dict, got {type(prompt).__name__}")


def as_prompt_list(prompts) -> list:
    """One prompt (a string, a dict, a token-id list) as a list of one; a list of prompts as it is."""
    if isinstance(prompts, (str, dict)) or (prompts and isinstance(prompts, (list, tuple))
                                            and isinstance(prompts[0], int)):
        return [prompts]
    return list(prompts)


class Tokenizer:
    """The checkpoint's tokenizer with transformers' methods, as ``LLM.get_tokenizer()`` returns it.

    Args:
        tokenizer: the ``tokenizers.Tokenizer``.
        eos_token_ids: the model's end-of-sequence ids (the first is ``eos_token_id``).
        bos_token_id: the model's beginning-of-sequence id, or None.
        renderer: a ``paged.models.chat_render.ChatRenderer`` for ``apply_chat_template`` (None: no template).
    """

    def __init__(self, tokenizer, eos_token_ids, bos_token_id=None, renderer=None) -> None:
        self.backend = tokenizer
        self.eos_token_id = eos_token_ids[0] if eos_token_ids else None
        self.bos_token_id = bos_token_id
        self.renderer = renderer
        self.eos_token = tokenizer.id_to_token(self.eos_token_id) if self.eos_token_id is not None else None
        self.bos_token = tokenizer.id_to_token(bos_token_id) if bos_token_id is not None else None

    @property
    def vocab_size(self) -> int:
        return self.backend.get_vocab_size()

    def __len__(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)

    def get_vocab(self) -> dict[str, int]:
        return self.backend.get_vocab()

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self.backend.encode(text, add_special_tokens=add_special_tokens).ids

    def __call__(self, text: str, add_special_tokens: bool = True) -> dict:
        return {"input_ids": self.encode(text, add_special_tokens)}

    def decode(self, token_ids, skip_special_tokens: bool = False) -> str:
        return self.backend.decode(list(token_ids), skip_special_tokens=skip_special_tokens)

    def convert_ids_to_tokens(self, token_ids) -> list[str]:
        return [self.backend.id_to_token(i) for i in token_ids]

    def apply_chat_template(self, messages: list[dict], tokenize: bool = True, add_generation_prompt: bool = False,
                            tools: list[dict] | None = None, **variables):
        """``messages`` in the checkpoint's template: the text, or (``tokenize``) its token ids."""
        if self.renderer is None:
            raise ValueError("this model has no chat template")
        text, ids = self.renderer.encode(messages, add_generation_prompt, variables=variables, tools=tools)
        return ids if tokenize else text
