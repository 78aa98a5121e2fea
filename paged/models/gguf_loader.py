"""``load_gguf``: a llama.cpp GGUF file -> the same ``LoadedModel`` a checkpoint folder gives.

A GGUF file is one self-contained checkpoint: a header of typed metadata
(``llama.block_count``, ``tokenizer.ggml.tokens``, ``tokenizer.chat_template``,
...) followed by the tensors, many of them quantized in blocks (Q8_0, Q4_1,
the K-quants). It is read with the ``gguf`` package, the reader published
with llama.cpp. Loading it takes four translations, each checked before any
weight is dequantized:

1. metadata -> ``config.json``'s fields (``hf_config_from_gguf``), then a
   ``ModelConfig``: the architecture
   string picks the family (``llama``, ``mistral``, ``qwen2``; anything else
   is refused before a tensor is read);
2. tensor names -> Hugging Face names (``blk.3.attn_q.weight`` ->
   ``model.layers.3.self_attn.q_proj.weight``), so the checkpoint plan and
   its shape checks are the folder loader's own;
3. tensor data -> dense weights: every block type is dequantized to float32
   by ``gguf`` and cast to the requested dtype; for the llama architecture
   the query and key rows are put back in Hugging Face's order (llama.cpp's
   converter interleaves the two halves of each head for its RoPE kernel);
4. tokenizer metadata -> a ``tokenizers.Tokenizer`` (byte-level BPE with the
   split rule llama.cpp applies for ``tokenizer.ggml.pre``), and the chat
   template and special tokens for the serving layer.

A file that fails any check raises ``ModelLoadError`` naming the file and the
problem (not GGUF, truncated, an unknown or unsupported tensor type, an
unsupported architecture, a missing tensor).

The four translations (``convert_gguf``) cost seconds, and their result depends
only on the file, the dtype and this code, so ``load_gguf`` does them once:
the result is written to a cache entry (``gguf_cache``) and later loads read
that entry instead of parsing and dequantizing again (``PAGED_GGUF_CACHE=0``:
convert at every load).
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import torch

from paged.models.config import ModelConfig, ModelLoadError
from paged.models.gguf_cache import Converted, GGUFCache

GGUF_MAGIC = b"GGUF"
# llama.cpp's architecture string -> config.json's model_type
SUPPORTED_ARCHITECTURES = {"llama": "llama", "mistral": "mistral", "qwen2": "qwen2"}
# GGUF per-layer tensor name -> Hugging Face per-layer name (under model.layers.N.)
_LAYER_TENSORS = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_GLOBAL_TENSORS = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
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


def is_gguf(path: str | Path) -> bool:
    """True when ``path`` is a file that starts with GGUF's magic bytes."""
    path = Path(path)
    if not path.is_file():
        return False
    with path.open("rb") as f:
        return f.read(4) == GGUF_MAGIC


def _supported_types():
    """The tensor types ``gguf`` can dequantize that this loader accepts."""
    from gguf import GGMLQuantizationType as T

    return (T.F32, T.F16, T.BF16, T.Q8_0, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1,
            T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K)


def check_gguf_file(path: Path) -> None:
    """Raise ``ModelLoadError`` unless ``path`` is a file that starts with GGUF's magic bytes."""
    if not path.is_file():
        raise ModelLoadError(f"{path}: no such file")
    if not is_gguf(path):
        raise ModelLoadError(f"{path}: not a GGUF file (it does not start with the bytes 'GGUF')")


def open_gguf(path: Path):
    """A ``gguf.GGUFReader`` over ``path``; a file that is not GGUF or is cut short raises ``ModelLoadError``."""
    try:
        import gguf
    except ImportError:
        raise ModelLoadError(f"{path}: reading GGUF files needs the 'gguf' package (pip install gguf)") from None
    check_gguf_file(path)
    try:
        return gguf.GGUFReader(path)
    except ValueError as err:  # an unknown tensor type number is a ValueError from the enum
        raise ModelLoadError(f"{path}: unreadable GGUF header ({err}); the file may be truncated, or use a "
                             "tensor type this version of the gguf package does not know") from None
    except Exception as err:  # numpy raises on a header that runs past the end of a truncated file
        raise ModelLoadError(f"{path}: unreadable GGUF header ({err}); the file may be truncated") from None


def _field(reader, key: str, default=None):
    """A metadata value as plain Python (str, int, float, list), or ``default`` when the key is absent."""
    field = reader.fields.get(key)
    return default if field is None else field.contents()


def _decimal(value: float) -> float:
    """A float32 metadata value as the shortest decimal that rounds to it (1e-05, not 9.99999974e-06),
    which is the value the converter was given."""
    return float(str(np.float32(value)))


def hf_config_from_gguf(reader, path: Path) -> dict:
    """The GGUF metadata as ``config.json``'s fields; unsupported files raise ``ModelLoadError`` before any
    tensor is read."""
    arch = _field(reader, "general.architecture")
    if arch not in SUPPORTED_ARCHITECTURES:
        raise ModelLoadError(
            f"{path}: architecture {arch!r} is not supported; supported: {', '.join(sorted(SUPPORTED_ARCHITECTURES))}"
        )

    def need(key: str):
        value = _field(reader, f"{arch}.{key}")
        if value is None:
            raise ModelLoadError(f"{path}: metadata key {arch}.{key!r} is missing")
        return value

    tensor_names = {t.name for t in reader.tensors}
    if "rope_freqs.weight" in tensor_names:
        raise ModelLoadError(f"{path}: per-frequency RoPE factors (rope_freqs.weight, Llama 3.1 style) are not supported")
    scaling_type = _field(reader, f"{arch}.rope.scaling.type", "none")
    if scaling_type not in ("none", "linear"):
        raise ModelLoadError(f"{path}: RoPE scaling {scaling_type!r} is not supported; supported: none, linear")
    heads = int(need("attention.head_count"))
    hidden = int(need("embedding_length"))
    head_dim = int(_field(reader, f"{arch}.attention.key_length", hidden // heads))
    if int(_field(reader, f"{arch}.rope.dimension_count", head_dim)) != head_dim:
        raise ModelLoadError(f"{path}: partial rotary embeddings ({arch}.rope.dimension_count != head dim) "
                             "are not supported")
    embedding = next((t for t in reader.tensors if t.name == "token_embd.weight"), None)
    if embedding is None:
        raise ModelLoadError(f"{path}: tensor 'token_embd.weight' (the token embedding) is missing")
    eos = [_field(reader, key) for key in ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id")]
    window = _field(reader, f"{arch}.attention.sliding_window")
    has_bias = "blk.0.attn_q.bias" in tensor_names
    hf = {
        "model_type": SUPPORTED_ARCHITECTURES[arch],
        "vocab_size": int(embedding.shape[-1]),  # GGUF lists dimensions fastest-first: [hidden, vocab]
        "hidden_size": hidden,
        "num_hidden_layers": int(need("block_count")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(_field(reader, f"{arch}.attention.head_count_kv", heads)),
        "head_dim": head_dim,
        "intermediate_size": int(need("feed_forward_length")),
        "max_position_embeddings": int(need("context_length")),
        "rope_theta": _decimal(_field(reader, f"{arch}.rope.freq_base", 10000.0)),
        "rms_norm_eps": _decimal(need("attention.layer_norm_rms_epsilon")),
        "attention_bias": has_bias,
        "mlp_bias": "blk.0.ffn_down.bias" in tensor_names,
        "tie_word_embeddings": "output.weight" not in tensor_names,
        "bos_token_id": _field(reader, "tokenizer.ggml.bos_token_id"),
        "eos_token_id": sorted({int(e) for e in eos if e is not None}),
        "sliding_window": window,
        "use_sliding_window": window is not None,
    }
    if scaling_type == "linear":
        hf["rope_scaling"] = {"rope_type": "linear", "factor": float(_field(reader, f"{arch}.rope.scaling.factor"))}
    return hf


def hf_tensor_name(gguf_name: str) -> str | None:
    """``blk.3.attn_q.weight`` -> ``model.layers.3.self_attn.q_proj.weight``; None for a name this family lacks."""
    stem, _, kind = gguf_name.rpartition(".")  # kind: weight or bias
    if stem in _GLOBAL_TENSORS:
        return f"{_GLOBAL_TENSORS[stem]}.{kind}"
    parts = stem.split(".")
    if len(parts) == 3 and parts[0] == "blk" and parts[2] in _LAYER_TENSORS:
        return f"model.layers.{parts[1]}.{_LAYER_TENSORS[parts[2]]}.{kind}"
    return None


def tensor_index(reader, path: Path) -> dict[str, tuple[Path, tuple[int, ...], object]]:
    """Hugging Face tensor name -> (file, row-major shape, ``ReaderTensor``), checking every tensor's type.

    GGUF lists dimensions fastest-first (``[576, 49152]`` for a 49152 x 576 embedding),
    so the shape is reversed into PyTorch's order.
    """
    supported = _supported_types()
    found = {}
    for tensor in reader.tensors:
        if tensor.tensor_type not in supported:
            names = ", ".join(t.name for t in supported)
            raise ModelLoadError(f"{path}: tensor {tensor.name!r} has type {tensor.tensor_type.name}, which this "
                                 f"loader cannot dequantize; supported: {names}")
        name = hf_tensor_name(tensor.name)
        if name is None:
            raise ModelLoadError(f"{path}: unexpected tensor {tensor.name!r} for a llama-family model")
        shape = tuple(int(d) for d in reversed(tensor.shape.tolist()))
        found[name] = (path, shape, tensor)
    return found


def unpermute_rows(weight: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Undo llama.cpp's query/key row order.

    Hugging Face's RoPE rotates dimension ``i`` of a head with dimension ``i + D/2``;
    llama.cpp's converter reorders each head's rows so that the pair sits side by side
    (``i`` at ``2i``, ``i + D/2`` at ``2i + 1``). Reading each head as ``[D/2, 2]`` and
    transposing to ``[2, D/2]`` puts the halves back.
    """
    rows = weight.shape[0]
    half = rows // num_heads // 2
    return weight.reshape(num_heads, half, 2, *weight.shape[1:]).transpose(1, 2).reshape(weight.shape)


def dequantize(tensor, path: Path) -> torch.Tensor:
    """A GGUF tensor as a float32 ``torch.Tensor`` in row-major shape."""
    from gguf import quants

    try:
        dense = quants.dequantize(np.asarray(tensor.data), tensor.tensor_type)
    except Exception as err:  # a data section cut short reads as a wrongly sized array
        raise ModelLoadError(f"{path}: tensor {tensor.name!r} cannot be dequantized ({err}); "
                             "the file may be truncated") from None
    shape = tuple(int(d) for d in reversed(tensor.shape.tolist()))
    return torch.from_numpy(np.require(dense, np.float32, ["C", "W"])).reshape(shape)  # W: a memmap view is copied


def _byte_level_vocab(tokens: list[str]) -> dict[str, int]:
    """Token -> id. Byte-level vocabularies spell every byte as a printable character; tokens are kept as stored."""
    vocab: dict[str, int] = {}
    for i, token in enumerate(tokens):
        vocab.setdefault(token, i)
    return vocab


def build_tokenizer(reader, path: Path):
    """A ``tokenizers.Tokenizer`` from the ``tokenizer.ggml.*`` metadata, or None (with a warning) when unsupported.

    Only byte-level BPE (``tokenizer.ggml.model == "gpt2"``, what Llama 3, Qwen2 and
    SmolLM use) is built; a SentencePiece vocabulary (``"llama"``) loads without a
    tokenizer, so the model still serves token-id prompts.
    """
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors

    kind = _field(reader, "tokenizer.ggml.model")
    if kind is None:  # no tokenizer in the file, like a folder without tokenizer.json
        return None
    if kind != "gpt2":
        warnings.warn(f"{path}: tokenizer model {kind!r} is not supported (only byte-level BPE, 'gpt2'); "
                      "the model loads without a tokenizer and serves token-id prompts only", stacklevel=3)
        return None
    tokens = list(_field(reader, "tokenizer.ggml.tokens"))
    merges = [tuple(m.split(" ", 1)) for m in _field(reader, "tokenizer.ggml.merges", [])]
    tokenizer = Tokenizer(models.BPE(vocab=_byte_level_vocab(tokens), merges=merges, fuse_unk=False))
    tokenizer.pre_tokenizer = _pre_tokenizer(_field(reader, "tokenizer.ggml.pre", "default"), path, pre_tokenizers, Regex)
    tokenizer.decoder = decoders.ByteLevel()
    types = list(_field(reader, "tokenizer.ggml.token_type", []))
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False)
                                  for t, kind in zip(tokens, types) if kind == _CONTROL])
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False)
                          for t, kind in zip(tokens, types) if kind == _USER_DEFINED])
    bos = _field(reader, "tokenizer.ggml.bos_token_id")
    if _field(reader, "tokenizer.ggml.add_bos_token", False) and bos is not None:
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


def chat_template_from_gguf(reader) -> tuple[str | None, dict[str, str]]:
    """``tokenizer.chat_template`` (or None) and the ``bos_token`` / ``eos_token`` strings it may use."""
    tokens = _field(reader, "tokenizer.ggml.tokens") or []
    specials = {}
    for key in ("bos", "eos"):
        i = _field(reader, f"tokenizer.ggml.{key}_token_id")
        specials[f"{key}_token"] = tokens[i] if i is not None and i < len(tokens) else ""
    return _field(reader, "tokenizer.chat_template"), specials


def convert_gguf(path: Path, dtype: torch.dtype, build_model, plan) -> Converted:
    """The four translations: header, names and shapes checked, every tensor dequantized and cast to ``dtype``.

    ``build_model`` and ``plan`` are ``load_gguf``'s. The model is built on the meta device only
    for its parameter names and shapes: each parameter is filled in a CPU tensor of its own.
    """
    reader = open_gguf(path)
    hf_config = hf_config_from_gguf(reader, path)
    config = ModelConfig.from_hf(hf_config, source=str(path))
    found = tensor_index(reader, path)
    with torch.device("meta"):
        skeleton = build_model(config)
    layout = plan(skeleton, found, path)
    with warnings.catch_warnings(record=True) as said:  # kept with the result, to be said at every load
        warnings.simplefilter("always")
        tokenizer = build_tokenizer(reader, path)
    template, specials = chat_template_from_gguf(reader)
    shapes = {name: p.shape for name, p in skeleton.named_parameters()}
    unpermute = {"q_proj": config.num_heads, "k_proj": config.num_kv_heads} if config.model_type != "qwen2" else {}
    weights = {}
    for pname, parts in layout.items():
        weights[pname] = torch.empty(shapes[pname], dtype=dtype)
        for ck_name, row, rows in parts:
            weight = dequantize(found[ck_name][2], path)
            proj = ck_name.split(".")[-2]
            if proj in unpermute:
                weight = unpermute_rows(weight, unpermute[proj])
            weights[pname][row : row + rows].copy_(weight)  # the cast to dtype
    return Converted(weights=weights, hf_config=hf_config,
                     tokenizer_json=None if tokenizer is None else tokenizer.to_str(),
                     chat_template=template, special_tokens=specials, warnings=[str(w.message) for w in said])


def load_gguf(path: str | Path, dtype: torch.dtype, device: str | torch.device, build_model, plan):
    """The pieces of a ``LoadedModel`` from one GGUF file, converted once and then read from the cache.

    Args:
        path: the ``.gguf`` file.
        dtype: the parameter dtype (weights are dequantized to float32, then cast).
        device: where the weights go.
        build_model: ``config -> model`` on the meta device (the folder loader's).
        plan: ``(model, found, path) -> layout``, the folder loader's name and shape check.

    Returns:
        ``(model, config, tokenizer, eos_token_ids, chat_template, special_tokens)``.
    """
    path = Path(path)
    check_gguf_file(path)
    # --8<-- [start:cache]
    cache = GGUFCache.for_file(path, dtype)  # None when PAGED_GGUF_CACHE=0
    converted = cache.read() if cache is not None else None
    if converted is None:  # not converted yet (or the entry failed its checks): dequantize once...
        converted = convert_gguf(path, dtype, build_model, plan)
        if cache is not None:
            cache.write(converted)  # ...and every later load reads this instead
    # --8<-- [end:cache]
    for message in converted.warnings:
        warnings.warn(message, stacklevel=3)
    config = ModelConfig.from_hf(converted.hf_config, source=str(path))
    with torch.device("meta"):
        model = build_model(config)
    names = {name for name, _ in model.named_parameters()}
    if names != converted.weights.keys():  # the code's hash is in the entry's key: a bug, not a stale entry
        raise ModelLoadError(f"{path}: the converted weights do not fit the model "
                             f"(missing {sorted(names - converted.weights.keys())[:3]}, "
                             f"unexpected {sorted(converted.weights.keys() - names)[:3]})")
    model.load_state_dict(converted.weights, strict=False, assign=True)  # the parameters are these tensors
    model.tie_weights()
    model = model.materialise(dtype, "cpu").to(device)  # the RoPE tables get memory; off the CPU, one copy
    model.reset_buffers()
    model.eval()
    tokenizer = None
    if converted.tokenizer_json is not None:
        from tokenizers import Tokenizer

        tokenizer = Tokenizer.from_str(converted.tokenizer_json)
    return model, config, tokenizer, list(config.eos_token_ids), converted.chat_template, converted.special_tokens
