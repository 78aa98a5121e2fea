"""What a model is, in one dataclass: ``ModelConfig``, the only thing the model definitions read.

It is parsed from a checkpoint folder's ``config.json`` (``hf_config.parse_hf_config``)
or from a GGUF file's metadata (``gguf_loader``, through the same parser).

Invariants: ``num_heads % num_kv_heads == 0``; ``rope_scaling`` is ``None`` or a dict whose
``rope_type`` is ``"linear"``, ``"llama3"``, ``"longrope"`` or ``"freq_factors"`` with that
type's parameters; ``layer_types`` is None or names every layer; anything this package cannot
run exactly raises ``ModelLoadError`` when the config is parsed, before a single weight is read.
"""

from __future__ import annotations

import dataclasses
import math

import torch


class ModelLoadError(ValueError):
    """A checkpoint folder this package cannot load; the message names the file and the problem."""


_DTYPES = {
    "float32": torch.float32,
    "float": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "half": torch.float16,
    "float64": torch.float64,
    "double": torch.float64,
}


def parse_dtype(value: str | torch.dtype | None) -> torch.dtype | None:
    """``"bfloat16"`` / ``"torch.bfloat16"`` / ``torch.bfloat16`` -> ``torch.bfloat16``; None stays None.

    Raises:
        ValueError: an unsupported dtype, with the supported list.
    """
    if value is None or isinstance(value, torch.dtype):
        if value is not None and value not in _DTYPES.values():
            raise ValueError(f"unsupported dtype {value}; supported: float32, bfloat16, float16, float64")
        return value
    name = str(value).removeprefix("torch.")
    if name not in _DTYPES:
        raise ValueError(f"unsupported dtype {value!r}; supported: float32, bfloat16, float16, float64")
    return _DTYPES[name]


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """The shape and the numerics of a decoder-only model.

    Attributes:
        architecture: the model class that runs it: ``"llama"`` (Llama, Mistral, Qwen2, Qwen3), ``"phi3"``,
            ``"gemma"`` (Gemma 2, Gemma 3 text) or ``"opt"``.
        model_type: ``config.json``'s ``model_type`` (``"llama"``, ``"qwen3"``, ``"gemma3_text"``, ...).
        vocab_size: V, rows of the embedding.
        hidden_size: width of the residual stream.
        num_layers: L.
        num_heads: H, query heads.
        num_kv_heads: H_kv, key/value heads (H_kv < H is grouped-query attention).
        head_dim: D.
        intermediate_size: width of the MLP (OPT's ``ffn_dim``).
        max_position_embeddings: positions the model was built for (rows of the RoPE table / of OPT's
            learned positions).
        rope_theta: RoPE base (LLaMA family).
        rope_scaling: ``None`` or ``{"rope_type": ..., ...}`` with that type's parameters: ``linear``
            (``factor``), ``llama3`` (Llama 3.1's bands), ``longrope`` (Phi-3: ``short_factor``,
            ``attention_factor``, ``original_max_position_embeddings``) or ``freq_factors`` (a GGUF
            file's ``rope_freqs``: ``factors``, one divisor per frequency).
        rope_local_theta: RoPE base of the sliding-window layers when it differs (Gemma 3), else None.
        rms_norm_eps: epsilon of RMSNorm.
        qkv_bias: q/k/v projections have a bias (Qwen2 always, Llama with ``attention_bias``, OPT with
            ``enable_bias``).
        o_bias: the output projection has a bias.
        mlp_bias: the MLP projections have biases.
        tie_word_embeddings: the LM head reuses the token embedding matrix.
        bos_token_id: beginning-of-sequence id or None.
        eos_token_ids: end-of-sequence ids from ``config.json`` (``generation_config.json`` may override).
        torch_dtype: the dtype the checkpoint was saved in, or None.
        sliding_window: W, when layers attend over a sliding window (a query at position p sees keys
            p - W + 1 .. p), else None.
        layer_types: per layer ``"sliding_attention"`` or ``"full_attention"`` (Gemma 2 / 3 interleave
            them); None: every layer slides when ``sliding_window`` is set.
        hidden_act: the MLP's gate activation: ``"silu"`` (SwiGLU) or ``"gelu_pytorch_tanh"`` (GeGLU, Gemma).
        qk_norm: queries and keys are RMS-normalised per head before RoPE (Qwen3, Gemma 3).
        query_pre_attn_scalar: the softmax scale is this ** -0.5 (Gemma), else ``head_dim ** -0.5``.
        attn_logit_softcapping: attention scores become ``cap * tanh(score / cap)`` (Gemma 2), else None.
        final_logit_softcapping: the logits likewise (Gemma 2), else None.
        word_embed_proj_dim: OPT's embedding width (``project_in`` / ``project_out`` when it differs from
            ``hidden_size``).
        do_layer_norm_before: OPT pre-LN (True, most sizes) or post-LN (False, 350m).
        layer_norm_affine: OPT LayerNorms have weight and bias.
        final_layer_norm: OPT has a LayerNorm after the last layer (pre-LN models only).
    """

    architecture: str
    model_type: str
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    max_position_embeddings: int
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None
    rms_norm_eps: float = 1e-6
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    tie_word_embeddings: bool = False
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    torch_dtype: torch.dtype | None = None
    sliding_window: int | None = None
    layer_types: tuple[str, ...] | None = None
    rope_local_theta: float | None = None
    hidden_act: str = "silu"
    qk_norm: bool = False
    query_pre_attn_scalar: float | None = None
    attn_logit_softcapping: float | None = None
    final_logit_softcapping: float | None = None
    word_embed_proj_dim: int | None = None
    do_layer_norm_before: bool = True
    layer_norm_affine: bool = True
    final_layer_norm: bool = True

    def __post_init__(self):
        if self.num_heads % self.num_kv_heads:
            raise ModelLoadError(
                f"num_attention_heads={self.num_heads} is not a multiple of "
                f"num_key_value_heads={self.num_kv_heads}"
            )
        if self.layer_types is not None and len(self.layer_types) != self.num_layers:
            raise ModelLoadError(f"layer_types names {len(self.layer_types)} layers, the model has {self.num_layers}")
        if self.sliding_window is not None and self.sliding_window < 1:
            raise ModelLoadError(f"sliding_window must be >= 1 (keys a query sees, itself included), "
                                 f"got {self.sliding_window}")
        for name in ("attn_logit_softcapping", "final_logit_softcapping"):
            cap = getattr(self, name)
            if cap is not None and not (math.isfinite(cap) and cap > 0):
                raise ModelLoadError(f"{name} must be a finite number > 0, got {cap}")

    def window(self, layer: int) -> int | None:
        """The sliding window of layer ``layer``, or None when it attends to the whole sequence."""
        if self.sliding_window is None:
            return None
        if self.layer_types is None or self.layer_types[layer] == "sliding_attention":
            return self.sliding_window
        return None

    @property
    def softmax_scale(self) -> float:
        """The scale of q·k before the softmax: ``query_pre_attn_scalar ** -0.5`` (Gemma), else ``D ** -0.5``."""
        return (self.query_pre_attn_scalar or self.head_dim) ** -0.5

    @property
    def max_model_len(self) -> int:
        """Longest sequence (prompt + output) the paged engine runs exactly for this model.

        The model's context (a sliding window does not shorten it: every attention path masks by
        window); for LongRoPE, the original context, where Phi-3 uses its short factors only.
        """
        limit = self.max_position_embeddings
        if self.rope_scaling is not None and self.rope_scaling["rope_type"] == "longrope":
            limit = min(limit, self.rope_scaling["original_max_position_embeddings"])
        return limit
