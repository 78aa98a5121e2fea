"""``load_gguf``: a llama.cpp GGUF file -> the same ``LoadedModel`` a checkpoint folder gives.

A GGUF file (``gguf_reader``) holds typed metadata, a tensor table and the
tensors, many of them quantized in blocks (Q8_0, Q4_1, the K-quants). Loading
it takes four translations, each checked before any weight is dequantized:

1. metadata -> ``config.json``'s fields (``hf_config_from_gguf``), then a
   ``ModelConfig``: the architecture string picks the family (``llama``,
   ``mistral``, ``qwen2``; anything else is refused before a tensor is read);
2. tensor names -> Hugging Face names (``gguf_names``), so the checkpoint plan
   and its shape checks are the folder loader's own (``checkpoint``);
3. tensor data -> dense weights: every block type is dequantized to float32
   by ``gguf`` and cast to the requested dtype; query and key rows the
   converter interleaved are put back in Hugging Face's order (the formats the
   quantized kernel reads go through its torch formulas instead, bitwise the
   same weights and faster: ``dequantize``);
4. tokenizer metadata -> a ``tokenizers.Tokenizer`` (``gguf_tokenizer``), and
   the chat template and special tokens for the serving layer.

A file that fails any check raises ``ModelLoadError`` naming the file and the
problem (not GGUF, truncated, an unknown or unsupported tensor type, an
unsupported architecture, a missing tensor).

The four translations (``convert_gguf``) cost seconds, and their result depends
only on the file, the dtype and this code, so ``load_gguf`` does them once:
the result is written to a cache entry (``gguf_cache``) and later loads read
that entry instead of parsing and dequantizing again (``PAGED_GGUF_CACHE=0``:
convert at every load). With ``quantization="gguf"`` the linears the kernel
reads take the file's blocks instead (``quantized.quantize_linears``): their
weights are not dequantized at all, neither in the conversion nor in the entry
(one of its own, beside the dense one), so the load holds the blocks, the
embedding and the few dense weights left, not a dense copy of the model.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import torch

from paged.models.checkpoint import LoadedModel, build_model, plan_checkpoint
from paged.models.config import ModelLoadError
from paged.models.gguf_cache import Converted, GGUFCache
from paged.models.gguf_names import ARCHITECTURES, hf_tensor_name, permuted_projections, stored_plus_one, unpermute_rows
from paged.models.gguf_reader import check_gguf_file, field, open_gguf, row_major_shape, tensor_table
from paged.models.hf_config import parse_hf_config
from paged.models.gguf_tokenizer import build_tokenizer, chat_template_from_gguf
from paged.models.quantized import (
    KERNEL_FORMATS,
    dequantize_blocks,
    pack_blocks,
    plan_quantized_linears,
    quantize_linears,
)

# Gemma 2 27B / Gemma 3 27B (by their layer counts) scale scores by hidden / heads, the others by the head
# dimension (llama.cpp's rule; the files do not say)
_GEMMA_27B_LAYERS = {"gemma2": 46, "gemma3": 62}


def _supported_types():
    """The tensor types ``gguf`` can dequantize that this loader accepts."""
    from gguf import GGMLQuantizationType as T

    return (T.F32, T.F16, T.BF16, T.Q8_0, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1,
            T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K)


def _decimal(value: float) -> float:
    """A float32 metadata value as the shortest decimal that rounds to it (1e-05, not 9.99999974e-06),
    which is the value the converter was given."""
    return float(str(np.float32(value)))


def hf_config_from_gguf(reader, path: Path) -> dict:
    """The GGUF metadata as ``config.json``'s fields; unsupported files raise ``ModelLoadError`` before any
    tensor is read."""
    arch = field(reader, "general.architecture")
    if arch not in ARCHITECTURES:
        raise ModelLoadError(
            f"{path}: architecture {arch!r} is not supported; supported: {', '.join(sorted(ARCHITECTURES))}"
        )

    def need(key: str):
        value = field(reader, f"{arch}.{key}")
        if value is None:
            raise ModelLoadError(f"{path}: metadata key {arch}.{key!r} is missing")
        return value

    tensors = {t.name: t for t in reader.tensors}
    if "rope_factors_short.weight" in tensors or "rope_factors_long.weight" in tensors:
        raise ModelLoadError(f"{path}: LongRoPE factors (rope_factors_short/long.weight, Phi-3 128k) are not "
                             "supported in GGUF files; load the Hugging Face folder")
    scaling_type = field(reader, f"{arch}.rope.scaling.type", "none")
    if scaling_type not in ("none", "linear"):
        raise ModelLoadError(f"{path}: RoPE scaling {scaling_type!r} is not supported; supported: none, linear")
    heads = int(need("attention.head_count"))
    hidden = int(need("embedding_length"))
    layers = int(need("block_count"))
    head_dim = int(field(reader, f"{arch}.attention.key_length", hidden // heads))
    if int(field(reader, f"{arch}.rope.dimension_count", head_dim)) != head_dim:
        raise ModelLoadError(f"{path}: partial rotary embeddings ({arch}.rope.dimension_count != head dim) "
                             "are not supported")
    embedding = tensors.get("token_embd.weight")
    if embedding is None:
        raise ModelLoadError(f"{path}: tensor 'token_embd.weight' (the token embedding) is missing")
    eos = [field(reader, key) for key in ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id")]
    if arch in _GEMMA_27B_LAYERS:  # a Gemma turn ends at <end_of_turn> (llama.cpp ends generation there too)
        tokens = field(reader, "tokenizer.ggml.tokens") or []
        eos.append(tokens.index("<end_of_turn>") if "<end_of_turn>" in tokens else None)
    window = field(reader, f"{arch}.attention.sliding_window")
    hf = {
        "model_type": ARCHITECTURES[arch],
        "vocab_size": int(embedding.shape[-1]),  # GGUF lists dimensions fastest-first: [hidden, vocab]
        "hidden_size": hidden,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": int(field(reader, f"{arch}.attention.head_count_kv", heads)),
        "head_dim": head_dim,
        "intermediate_size": int(need("feed_forward_length")),
        "max_position_embeddings": int(need("context_length")),
        "rope_theta": _decimal(field(reader, f"{arch}.rope.freq_base", 10000.0)),
        "rms_norm_eps": _decimal(need("attention.layer_norm_rms_epsilon")),
        "attention_bias": "blk.0.attn_q.bias" in tensors,
        "mlp_bias": "blk.0.ffn_down.bias" in tensors,
        "tie_word_embeddings": "output.weight" not in tensors,
        "bos_token_id": field(reader, "tokenizer.ggml.bos_token_id"),
        "eos_token_id": sorted({int(e) for e in eos if e is not None}),
        "sliding_window": window,
        "use_sliding_window": window is not None,
    }
    if arch in _GEMMA_27B_LAYERS:
        hf["query_pre_attn_scalar"] = hidden // heads if layers == _GEMMA_27B_LAYERS[arch] else head_dim
        hf["sliding_window_pattern"] = field(reader, f"{arch}.attention.sliding_window_pattern", 6)
        for key in ("attn_logit_softcapping", "final_logit_softcapping"):
            hf[key] = field(reader, f"{arch}.{key}")
    if scaling_type == "linear":
        hf["rope_scaling"] = {"rope_type": "linear", "factor": float(field(reader, f"{arch}.rope.scaling.factor"))}
    if "rope_freqs.weight" in tensors:  # Llama 3.1's bands as llama.cpp keeps them: one divisor per frequency
        factors = dequantize(tensors["rope_freqs.weight"], path).reshape(-1)
        if factors.numel() != head_dim // 2:
            raise ModelLoadError(f"{path}: rope_freqs.weight has {factors.numel()} factors, the head dimension "
                                 f"{head_dim} needs {head_dim // 2}")
        hf["rope_scaling"] = {"rope_type": "freq_factors", "factors": factors.tolist()}
    return hf


def tensor_index(reader, path: Path, model_type: str) -> dict[str, tuple[Path, tuple[int, ...], object]]:
    """Hugging Face tensor name -> (file, row-major shape, ``ReaderTensor``), checking every tensor's type.
    ``rope_freqs.weight`` is not a weight: ``hf_config_from_gguf`` read it into the config."""
    supported = _supported_types()
    found = {}
    for tensor in reader.tensors:
        if tensor.name == "rope_freqs.weight":
            continue
        if tensor.tensor_type not in supported:
            names = ", ".join(t.name for t in supported)
            raise ModelLoadError(f"{path}: tensor {tensor.name!r} has type {tensor.tensor_type.name}, which this "
                                 f"loader cannot dequantize; supported: {names}")
        name = hf_tensor_name(tensor.name, model_type)
        if name is None:
            raise ModelLoadError(f"{path}: unexpected tensor {tensor.name!r} for a {model_type} model")
        found[name] = (path, row_major_shape(tensor), tensor)
    return found


def dequantize(tensor, path: Path) -> torch.Tensor:
    """A GGUF tensor as a float32 ``torch.Tensor`` in row-major shape.

    ``gguf``'s numpy dequantizers, except for a matrix in a format the quantized kernel reads
    (``quantized.KERNEL_FORMATS``: Q4_0, Q4_1, Q5_0, Q8_0, Q4_K, Q6_K): there its torch formulas,
    ``quantized.dequantize_blocks``, which give gguf's weights bit for bit
    (``tests/kernels/test_quant_linear.py``) on every core: Gemma 3 270M's 127 such tensors took 6.4 s
    in numpy and 1.0 s so (an AVX2 EPYC, 2 cores).
    """
    from gguf import quants

    kind, shape = int(tensor.tensor_type), row_major_shape(tensor)
    try:
        if kind in KERNEL_FORMATS and len(shape) == 2:
            return dequantize_blocks(pack_blocks(tensor.data, kind, *shape), kind, *shape)
        dense = quants.dequantize(np.asarray(tensor.data), tensor.tensor_type)
    except Exception as err:  # a data section cut short reads as a wrongly sized array
        raise ModelLoadError(f"{path}: tensor {tensor.name!r} cannot be dequantized ({err}); "
                             "the file may be truncated") from None
    return torch.from_numpy(np.require(dense, np.float32, ["C", "W"])).reshape(shape)  # W: a memmap view is copied


def convert_gguf(path: Path, dtype: torch.dtype, quantization: str | None = None) -> Converted:
    """The four translations: header, names and shapes checked, every tensor dequantized and cast to ``dtype``.

    The model is built on the meta device only for its parameter names and shapes: each parameter is
    filled in a CPU tensor of its own. With ``quantization="gguf"``, the weights of the linears that will
    take the file's blocks (``quantized.plan_quantized_linears``) are left out.
    """
    reader = open_gguf(path)
    hf_config = hf_config_from_gguf(reader, path)
    config = parse_hf_config(hf_config, source=str(path))
    found = tensor_index(reader, path, config.model_type)
    with torch.device("meta"):
        skeleton = build_model(config)
    layout = plan_checkpoint(skeleton, found, path)
    with warnings.catch_warnings(record=True) as said:  # kept with the result, to be said at every load
        warnings.simplefilter("always")
        tokenizer = build_tokenizer(reader, path)
    template, specials = chat_template_from_gguf(reader)
    shapes = {name: p.shape for name, p in skeleton.named_parameters()}
    unpermute = permuted_projections(config)
    table = tensor_table(reader)
    if quantization == "gguf":  # those layers read the blocks (a tied LM head: the embedding's, kept)
        blocks = set(plan_quantized_linears(skeleton, table))
        layout = {p: parts for p, parts in layout.items() if p.rpartition(".")[0] not in blocks}
    weights = {}
    for pname, parts in layout.items():
        weights[pname] = torch.empty(shapes[pname], dtype=dtype)
        for ck_name, row, rows in parts:
            weight = dequantize(found[ck_name][2], path)
            proj = ck_name.split(".")[-2]
            if proj in unpermute:
                weight = unpermute_rows(weight, unpermute[proj])
            if stored_plus_one(config.model_type, ck_name):
                weight = weight - 1  # float32, as transformers reads a Gemma file
            weights[pname][row : row + rows].copy_(weight)  # the cast to dtype
    return Converted(weights=weights, hf_config=hf_config,
                     tokenizer_json=None if tokenizer is None else tokenizer.to_str(),
                     chat_template=template, special_tokens=specials, warnings=[str(w.message) for w in said],
                     tensors=table)


def load_gguf(path: str | Path, dtype: torch.dtype, device: str | torch.device,
              quantization: str | None = None) -> LoadedModel:
    """A ``LoadedModel`` from one GGUF file, converted once and then read from the cache.

    Args:
        path: the ``.gguf`` file.
        dtype: the parameter dtype (weights are dequantized to float32, then cast).
        device: where the weights go.
        quantization: None, or ``"gguf"``: the linears keep the file's blocks (``quantized``); the caller
            (``load_model``) has checked the combination.
    """
    path = Path(path)
    check_gguf_file(path)
    # --8<-- [start:cache]
    cache = GGUFCache.for_file(path, dtype, quantization)  # None when PAGED_GGUF_CACHE=0
    converted = cache.read() if cache is not None else None
    if converted is None:  # not converted yet (or the entry failed its checks): dequantize once...
        converted = convert_gguf(path, dtype, quantization)
        if cache is not None:
            cache.write(converted)  # ...and every later load reads this instead
    # --8<-- [end:cache]
    for message in converted.warnings:
        warnings.warn(message, stacklevel=3)
    config = parse_hf_config(converted.hf_config, source=str(path))
    with torch.device("meta"):
        model = build_model(config)
    if quantization == "gguf":  # before any weight has memory: the layers replaced never get dense ones
        quantize_linears(model, path, converted.tensors, dtype)
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
    return LoadedModel(model, config, tokenizer, list(config.eos_token_ids), path, converted.chat_template,
                       converted.special_tokens)
