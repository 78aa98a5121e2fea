"""Writing GGUF files in the test, the way llama.cpp's converter lays them out.

``write_gguf`` turns a Hugging Face state dict plus its config into a GGUF
file with ``gguf.GGUFWriter``: llama.cpp's tensor names, dimensions listed
fastest-first, the query/key rows of the llama architecture interleaved per
head (``permute_rows``, the inverse of the loader's ``unpermute_rows``), the
tokenizer as ``tokenizer.ggml.*`` metadata and an optional chat template.
The loader under test must undo each of these to get the original weights
back. No downloads.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch

from paged.models.default import chat_model_path

_HF_TO_GGUF_LAYER = {
    "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
    "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}
_HF_TO_GGUF_GLOBAL = {"model.embed_tokens": "token_embd", "model.norm": "output_norm", "lm_head": "output"}
_QK_NORMS = {"self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm"}
_GEMMA = {"post_attention_layernorm": "post_attention_norm", "pre_feedforward_layernorm": "ffn_norm",
          "post_feedforward_layernorm": "post_ffw_norm"}
_ARCH_LAYER = {"qwen3": _QK_NORMS, "phi3": {"self_attn.qkv_proj": "attn_qkv", "mlp.gate_up_proj": "ffn_up"},
               "gemma2": _GEMMA, "gemma3": {**_GEMMA, **_QK_NORMS}}


def gguf_name(hf_name: str, arch: str = "llama") -> str:
    """``model.layers.3.self_attn.q_proj.weight`` -> ``blk.3.attn_q.weight`` (llama.cpp's name for ``arch``)."""
    stem, _, kind = hf_name.rpartition(".")
    if stem in _HF_TO_GGUF_GLOBAL:
        return f"{_HF_TO_GGUF_GLOBAL[stem]}.{kind}"
    _, _, layer, module = stem.split(".", 3)
    names = {**_HF_TO_GGUF_LAYER, **_ARCH_LAYER.get(arch, {})}
    return f"blk.{layer}.{names[module]}.{kind}"


def llama3_rope_factors(hf_config: dict) -> np.ndarray | None:
    """llama.cpp's converter's ``rope_freqs``: Llama 3.1's bands as one divisor per frequency (None without)."""
    rope = hf_config.get("rope_parameters") or hf_config.get("rope_scaling") or {}
    if rope.get("rope_type") != "llama3":
        return None
    dim = hf_config.get("head_dim") or hf_config["hidden_size"] // hf_config["num_attention_heads"]
    freqs = 1.0 / (rope.get("rope_theta", 10000.0) ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    factor, low, high = rope["factor"], rope["low_freq_factor"], rope["high_freq_factor"]
    original = rope["original_max_position_embeddings"]
    factors = []
    for freq in freqs.tolist():
        wavelen = 2 * math.pi / freq
        if wavelen < original / high:
            factors.append(1.0)
        elif wavelen > original / low:
            factors.append(factor)
        else:
            smooth = (original / wavelen - low) / (high - low)
            factors.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(factors, dtype=np.float32)


def permute_rows(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """llama.cpp's converter order: each head's two RoPE halves interleaved row by row."""
    half = weight.shape[0] // num_heads // 2
    return weight.reshape(num_heads, 2, half, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


def write_gguf(
    path: Path,
    state_dict: dict[str, torch.Tensor],
    hf_config: dict,
    *,
    arch: str = "llama",
    qtype: gguf.GGMLQuantizationType = gguf.GGMLQuantizationType.F32,
    tokenizer_json: Path | None = None,
    chat_template: str | None = None,
    tensor_types: dict[str, gguf.GGMLQuantizationType] | None = None,
    tokenizer_pre: str = "gpt2",
    extra_tensors: dict[str, np.ndarray] | None = None,
    sentencepiece: tuple[list[str], list[float], list[int]] | None = None,
    raw_tensors: dict[str, tuple[gguf.GGMLQuantizationType, np.ndarray]] | None = None,
) -> Path:
    """Write ``state_dict`` (Hugging Face names) as a GGUF file of architecture ``arch``.

    Args:
        qtype: the type of 2-D weights (1-D tensors stay F32, as llama.cpp keeps norms).
        tokenizer_json: a byte-level BPE ``tokenizer.json`` whose vocabulary and merges go into the metadata.
        tensor_types: per GGUF tensor name, a type to write that tensor in instead (raw values, no conversion).
        tokenizer_pre: ``tokenizer.ggml.pre``, the name of the split rule applied before BPE.
        extra_tensors: GGUF name -> float32 array, written as they are (tensors of no Hugging Face name).
        raw_tensors: per GGUF tensor name, ``(type, bytes [rows, bytes per row])`` written instead of the
            state dict's values (e.g. K-quant blocks, which ``gguf`` cannot quantize).
        sentencepiece: ``(pieces, scores, types)`` of a SentencePiece vocabulary (``tokenizer.ggml.model =
            llama``; BOS ``<s>`` or ``<bos>``, EOS, unknown ``<unk>``), instead of ``tokenizer_json``.
    """
    heads, kv_heads = hf_config["num_attention_heads"], hf_config.get("num_key_value_heads") or hf_config[
        "num_attention_heads"]
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_block_count(hf_config["num_hidden_layers"])
    writer.add_context_length(hf_config["max_position_embeddings"])
    writer.add_embedding_length(hf_config["hidden_size"])
    writer.add_feed_forward_length(hf_config["intermediate_size"])
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    rope = hf_config.get("rope_parameters") or {}
    rope = rope.get("full_attention", rope)  # Gemma 3 keeps one set per layer type: the file has the global one
    writer.add_rope_freq_base(float(rope.get("rope_theta", hf_config.get("rope_theta", 10000.0))))
    writer.add_layer_norm_rms_eps(float(hf_config["rms_norm_eps"]))
    head_dim = hf_config.get("head_dim") or hf_config["hidden_size"] // heads
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_rope_dimension_count(head_dim)
    if hf_config.get("sliding_window") and arch in ("gemma2", "gemma3", "phi3"):
        writer.add_sliding_window(hf_config["sliding_window"])
    if arch == "gemma2":
        writer.add_float32("gemma2.attn_logit_softcapping", hf_config["attn_logit_softcapping"])
        writer.add_float32("gemma2.final_logit_softcapping", hf_config["final_logit_softcapping"])
    factors = llama3_rope_factors(hf_config) if arch == "llama" else None
    if factors is not None:
        writer.add_tensor("rope_freqs.weight", factors)
    for name, data in (extra_tensors or {}).items():
        writer.add_tensor(name, data)
    if tokenizer_json is not None:
        _add_tokenizer(writer, tokenizer_json, tokenizer_pre)
    if sentencepiece is not None:
        pieces, scores, types = sentencepiece
        writer.add_tokenizer_model("llama")
        writer.add_tokenizer_pre("default")
        writer.add_token_list(pieces)
        writer.add_token_scores(scores)
        writer.add_token_types(types)
        writer.add_bos_token_id(pieces.index("<bos>" if "<bos>" in pieces else "<s>"))
        writer.add_eos_token_id(pieces.index("<eos>" if "<eos>" in pieces else "</s>"))
        writer.add_unk_token_id(pieces.index("<unk>"))
        writer.add_add_bos_token(True)
    if chat_template is not None:
        writer.add_chat_template(chat_template)
    for name, tensor in state_dict.items():
        if name.endswith("rotary_emb.inv_freq") or (name == "lm_head.weight" and hf_config.get("tie_word_embeddings")):
            continue  # a tied LM head is not written: its absence is how GGUF says "tied"
        data = tensor.detach().to(torch.float32).numpy()
        permuted = arch in ("llama", "mistral")  # the architectures llama.cpp rotates in adjacent pairs
        if permuted and ".q_proj." in name:
            data = permute_rows(data, heads)
        elif permuted and ".k_proj." in name:
            data = permute_rows(data, kv_heads)
        if arch.startswith("gemma") and name.endswith("norm.weight"):
            data = data + np.float32(1)  # llama.cpp's Gemma norms multiply by the weight as stored
        gname = gguf_name(name, arch)
        if raw_tensors and gname in raw_tensors:
            kind, raw = raw_tensors[gname]
            writer.add_tensor(gname, raw, raw_shape=raw.shape, raw_dtype=kind)
            continue
        if tensor_types and gname in tensor_types:
            writer.add_tensor(gname, data.astype(np.int32), raw_dtype=tensor_types[gname])
            continue
        kind = qtype if data.ndim == 2 else gguf.GGMLQuantizationType.F32
        raw = gguf.quants.quantize(data, kind) if kind != gguf.GGMLQuantizationType.F32 else data
        writer.add_tensor(gname, raw, raw_shape=raw.shape, raw_dtype=kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return Path(path)


def _add_tokenizer(writer, tokenizer_json: Path, pre: str) -> None:
    """``tokenizer.ggml.*`` from a byte-level BPE ``tokenizer.json``: tokens by id, merges, special tokens as control."""
    spec = json.loads(Path(tokenizer_json).read_text())
    vocab = dict(spec["model"]["vocab"])
    added = {t["content"]: t for t in spec["added_tokens"]}
    vocab.update({t["content"]: t["id"] for t in spec["added_tokens"]})
    tokens = [tok for tok, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    merges = [m if isinstance(m, str) else " ".join(m) for m in spec["model"]["merges"]]
    types = [gguf.TokenType.CONTROL if added.get(t, {}).get("special") else gguf.TokenType.NORMAL for t in tokens]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(pre)
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    writer.add_bos_token_id(vocab["<|bos|>"])
    writer.add_eos_token_id(vocab["<|eos|>"])
    writer.add_add_bos_token(True)


# SmolLM2-135M-Instruct, fetched by `make install` (paged.models.default); its tests skip without it.
SMOLLM2 = chat_model_path()
needs_smollm2 = pytest.mark.skipif(
    not SMOLLM2.is_file(),
    reason=f"SmolLM2-135M-Instruct is not fetched ({SMOLLM2}): run `make install` or `python -m paged.models.default`",
)
