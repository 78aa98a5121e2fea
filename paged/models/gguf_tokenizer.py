"""A GGUF file's tokenizer: the ``tokenizer.ggml.*`` metadata rebuilt into a ``tokenizers.Tokenizer``.

llama.cpp keeps the vocabulary in the file's header instead of a
``tokenizer.json``: the tokens by id, their types (normal, control,
user-defined, byte), the BPE merges, and the name of the rule that splits text
before BPE (``tokenizer.ggml.pre``). ``build_tokenizer`` turns them back into
what a Hugging Face folder would have shipped, so serving code never knows
where its tokenizer came from. ``chat_template_from_gguf`` reads the chat
template and the special tokens it may print.
"""

from __future__ import annotations

import warnings
from pathlib import Path

from paged.models.gguf_reader import field
from paged.models.gguf_sentencepiece import sentencepiece_tokenizer

# GGUF token types (llama.cpp's llama_token_type): 3 is a control token, 4 a user-defined one.
_CONTROL, _USER_DEFINED = 3, 4
# tokenizer.ggml.pre -> the split applied before byte-level BPE. "digits" is llama.cpp's
# STARCODER / SMOLLM rule: every digit is its own piece, then GPT-2's regex.
_LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                 r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2_SPLIT = _LLAMA3_SPLIT.replace(r"\p{N}{1,3}", r"\p{N}")
_PRE_TOKENIZERS = {
    "default": "gpt2", "gpt2": "gpt2",
    "smollm": "digits", "starcoder": "digits", "refact": "digits", "codeshell": "digits",
    "llama-bpe": _LLAMA3_SPLIT, "llama3": _LLAMA3_SPLIT, "qwen2": _QWEN2_SPLIT,
}


def _byte_level_vocab(tokens: list[str]) -> dict[str, int]:
    """Token -> id. Byte-level vocabularies spell every byte as a printable character; tokens are kept as stored."""
    vocab: dict[str, int] = {}
    for i, token in enumerate(tokens):
        vocab.setdefault(token, i)
    return vocab


def build_tokenizer(reader, path: Path):
    """A ``tokenizers.Tokenizer`` from the ``tokenizer.ggml.*`` metadata, or None when the file has none
    (or, with a warning, one of another kind).

    Byte-level BPE (``tokenizer.ggml.model == "gpt2"``: Llama 3, Qwen2, SmolLM) comes with its merges
    and the split rule of ``tokenizer.ggml.pre``; a SentencePiece vocabulary (``"llama"``: Llama 2,
    Mistral, Phi-3, Gemma) is rebuilt by ``gguf_sentencepiece``. Control tokens become special tokens,
    user-defined ones added tokens, and ``add_bos_token`` a BOS put before every text.
    """
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors

    kind = field(reader, "tokenizer.ggml.model")
    if kind is None:  # no tokenizer in the file, like a folder without tokenizer.json
        return None
    tokens = list(field(reader, "tokenizer.ggml.tokens"))
    if kind == "gpt2":
        merges = [tuple(m.split(" ", 1)) for m in field(reader, "tokenizer.ggml.merges", [])]
        vocab = _byte_level_vocab(tokens)
        tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False))
        pre = field(reader, "tokenizer.ggml.pre", "default")
        tokenizer.pre_tokenizer = _pre_tokenizer(pre, path, pre_tokenizers, Regex)
        tokenizer.decoder = decoders.ByteLevel()
        add_bos = field(reader, "tokenizer.ggml.add_bos_token", False)
    elif kind == "llama":
        unk = field(reader, "tokenizer.ggml.unknown_token_id")
        scores = list(field(reader, "tokenizer.ggml.scores", [0.0] * len(tokens)))
        tokenizer, vocab = sentencepiece_tokenizer(field(reader, "general.architecture"), tokens, scores,
                                                   tokens[unk] if unk is not None else None)
        add_bos = field(reader, "tokenizer.ggml.add_bos_token", True)  # llama.cpp's default for SentencePiece
    else:
        warnings.warn(f"{path}: tokenizer model {kind!r} is not supported (byte-level BPE 'gpt2' and "
                      "SentencePiece 'llama' are); the model loads without a tokenizer and serves token-id "
                      "prompts only", stacklevel=3)
        return None
    types = list(field(reader, "tokenizer.ggml.token_type", []))
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False)
                                  for t, kind in zip(tokens, types) if kind == _CONTROL])
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False)
                          for t, kind in zip(tokens, types) if kind == _USER_DEFINED and t in vocab])
    bos = field(reader, "tokenizer.ggml.bos_token_id")
    if add_bos and bos is not None:
        tokenizer.post_processor = processors.TemplateProcessing(
            single=f"{tokens[bos]} $A", pair=f"{tokens[bos]} $A {tokens[bos]} $B", special_tokens=[(tokens[bos], bos)])
    return tokenizer


def _pre_tokenizer(pre: str, path: Path, pre_tokenizers, Regex):
    """The split rule llama.cpp uses for ``tokenizer.ggml.pre``, followed by the byte-level mapping."""
    rule = _PRE_TOKENIZERS.get(pre)
    if rule is None:
        warnings.warn(f"{path}: pre-tokenizer {pre!r} is not known here; splitting text with GPT-2's rule, "
                      "which may tokenize some texts differently from llama.cpp", stacklevel=4)
        rule = "gpt2"
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=rule in ("gpt2", "digits"))
    if rule == "gpt2":
        return byte_level
    if rule == "digits":
        return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    return pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(rule), behavior="isolated"), byte_level])


# Gemma's turn format, for Gemma files that carry no template: a system message opens the first user
# turn, the assistant's role is called "model", each turn ends with <end_of_turn> and a newline.
GEMMA_TURNS = (
    "{{ bos_token }}"
    "{%- set first = messages[0]['content'] + '\\n\\n' if messages and messages[0]['role'] == 'system' else '' -%}"
    "{%- for m in messages if m['role'] != 'system' -%}"
    "{{ '<start_of_turn>' + ('model' if m['role'] == 'assistant' else m['role']) + '\\n'"
    " + (first if loop.first else '') + m['content'] | trim + '<end_of_turn>\\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<start_of_turn>model\\n' }}{%- endif -%}"
)


def chat_template_from_gguf(reader) -> tuple[str | None, dict[str, str]]:
    """``tokenizer.chat_template`` (or None; Gemma's turn format, ``GEMMA_TURNS``, for a Gemma file without
    one) and the ``bos_token`` / ``eos_token`` strings it may use."""
    tokens = field(reader, "tokenizer.ggml.tokens") or []
    specials = {}
    for key in ("bos", "eos"):
        i = field(reader, f"tokenizer.ggml.{key}_token_id")
        specials[f"{key}_token"] = tokens[i] if i is not None and i < len(tokens) else ""
    template = field(reader, "tokenizer.chat_template")
    if template is None and str(field(reader, "general.architecture", "")).startswith("gemma") \
            and "<start_of_turn>" in tokens:
        template = GEMMA_TURNS
    return template, specials


