"""How llama.cpp's converter names and orders a model's tensors in a GGUF file, and how to undo it.

Two translations, shared by the dense loader (``gguf_loader``) and the quantized
layers (``quantized``), which both read tensors out of the same file:

* names: ``blk.3.attn_q.weight`` -> ``model.layers.3.self_attn.q_proj.weight``
  (``hf_tensor_name``, per family: Gemma's ``ffn_norm`` is the norm before the
  MLP, Phi-3's ``attn_qkv`` is fused as in its folder), so a GGUF file is
  checked against the model with the same plan as a Hugging Face folder;
* row order: for the ``llama`` architecture the converter reorders the rows of
  each query and key head so that the pairs RoPE rotates together sit side by
  side (llama.cpp's rotation of adjacent pairs); ``unpermute_rows`` puts them
  back in Hugging Face's order (pairs ``i`` and ``i + D/2``), and
  ``permuted_projections`` says which projections need it;
* values: Gemma's norm weights are stored as ``1 + w`` (``stored_plus_one``).
"""

from __future__ import annotations

import torch

from paged.models.config import ModelConfig

# llama.cpp's architecture string -> config.json's model_type
ARCHITECTURES = {"llama": "llama", "mistral": "mistral", "qwen2": "qwen2", "qwen3": "qwen3", "phi3": "phi3",
                 "gemma2": "gemma2", "gemma3": "gemma3_text"}
# GGUF per-layer tensor name -> Hugging Face per-layer name (under model.layers.N.), for every family ...
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
# ... and what each family names otherwise
_QK_NORMS = {"attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm"}
_GEMMA = {"post_attention_norm": "post_attention_layernorm", "ffn_norm": "pre_feedforward_layernorm",
          "post_ffw_norm": "post_feedforward_layernorm"}
_FAMILY_TENSORS = {
    "qwen3": _QK_NORMS,
    "phi3": {"attn_qkv": "self_attn.qkv_proj", "ffn_up": "mlp.gate_up_proj"},  # fused in the file as in the folder
    "gemma2": _GEMMA,
    "gemma3_text": {**_GEMMA, **_QK_NORMS},
}
GLOBAL_TENSORS = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
# model types whose query/key rows llama.cpp's converter interleaves per head (the others rotate halves,
# as transformers does)
_PERMUTED_MODEL_TYPES = ("llama", "mistral")
# model types whose norm weights llama.cpp stores as 1 + w (its RMSNorm multiplies by the weight as stored)
_NORMS_PLUS_ONE = ("gemma2", "gemma3_text")


def hf_tensor_name(gguf_name: str, model_type: str) -> str | None:
    """``blk.3.attn_q.weight`` -> ``model.layers.3.self_attn.q_proj.weight``; None for a name the family lacks."""
    stem, _, kind = gguf_name.rpartition(".")  # kind: weight or bias
    if stem in GLOBAL_TENSORS:
        return f"{GLOBAL_TENSORS[stem]}.{kind}"
    parts = stem.split(".")
    names = {**_LAYER_TENSORS, **_FAMILY_TENSORS.get(model_type, {})}
    if len(parts) == 3 and parts[0] == "blk" and parts[2] in names:
        return f"model.layers.{parts[1]}.{names[parts[2]]}.{kind}"
    return None


def permuted_projections(config: ModelConfig) -> dict[str, int]:
    """Projection name -> heads, for the projections whose rows the converter interleaved (else empty)."""
    if config.model_type not in _PERMUTED_MODEL_TYPES:
        return {}
    return {"q_proj": config.num_heads, "k_proj": config.num_kv_heads}


def stored_plus_one(model_type: str, hf_name: str) -> bool:
    """Whether llama.cpp stored this tensor as ``1 + w``: every norm weight of a Gemma (which the loader
    gives back as the file's value minus one, in float32, as transformers reads these files)."""
    return model_type in _NORMS_PLUS_ONE and hf_name.endswith("norm.weight")


def unpermute_rows(weight: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Undo llama.cpp's query/key row order.

    Hugging Face's RoPE rotates dimension ``i`` of a head with dimension ``i + D/2``;
    llama.cpp's converter reorders each head's rows so that the pair sits side by side
    (``i`` at ``2i``, ``i + D/2`` at ``2i + 1``). Reading each head as ``[D/2, 2]`` and
    transposing to ``[2, D/2]`` puts the halves back. Works on any row payload: float
    weights ``[rows, K]`` or a quantized tensor's block bytes ``[rows, bytes]``.
    """
    rows = weight.shape[0]
    half = rows // num_heads // 2
    return weight.reshape(num_heads, half, 2, *weight.shape[1:]).transpose(1, 2).reshape(weight.shape)
