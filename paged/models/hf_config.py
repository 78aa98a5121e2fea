"""``parse_hf_config``: a Hugging Face ``config.json`` (as a dict) -> ``ModelConfig``.

``config.json`` comes in two dialects: transformers 4 writes ``rope_theta`` and
``rope_scaling`` at the top level and ``torch_dtype``; transformers 5 writes
``rope_parameters`` (for Gemma 3, one per layer type) and ``dtype``. Both are
read. Each family's reader says what the family adds over LLaMA:

* ``qwen3``: per-head q/k RMSNorm, ``attention_bias`` off by default;
* ``phi3``: fused ``qkv_proj`` / ``gate_up_proj`` in the checkpoint, LongRoPE;
* ``gemma2``: GeGLU, sandwich norms, ``query_pre_attn_scalar``, soft-capped
  attention scores and logits, sliding-window and global layers alternating;
* ``gemma3_text``: Gemma 2 without soft-capping, with q/k norms, five
  sliding layers (RoPE base 10 000) to one global layer (base 1 000 000).

Anything this package cannot run exactly raises ``ModelLoadError`` naming the
file and the key, before a weight is read.
"""

from __future__ import annotations

import math
from typing import Any

from paged.models.config import ModelConfig, ModelLoadError, parse_dtype

# model_type -> the architecture (model class) that runs it
SUPPORTED_MODEL_TYPES = {"llama": "llama", "mistral": "llama", "qwen2": "llama", "qwen3": "llama", "phi3": "phi3",
                         "gemma2": "gemma", "gemma3_text": "gemma", "opt": "opt"}
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3", "longrope", "freq_factors")  # the last: GGUF's rope_freqs
_ACTIVATIONS = {"llama": ("silu",), "phi3": ("silu",), "gemma": ("gelu_pytorch_tanh",)}


def parse_hf_config(hf: dict, source: str = "config.json") -> ModelConfig:
    """Parse a Hugging Face ``config.json`` dict.

    Args:
        hf: the parsed JSON.
        source: the file it came from, for error messages.

    Raises:
        ModelLoadError: unknown ``model_type`` (the message lists the supported ones), a missing
            key, an unsupported RoPE type or activation.
    """
    model_type = hf.get("model_type")
    if model_type not in SUPPORTED_MODEL_TYPES:
        hint = " (a multimodal Gemma 3 folder: only the text model, gemma3_text, is)" if model_type == "gemma3" else ""
        raise ModelLoadError(
            f"{source}: model_type {model_type!r} is not supported{hint}; "
            f"supported: {', '.join(sorted(SUPPORTED_MODEL_TYPES))}"
        )

    def need(key):
        if hf.get(key) is None:
            raise ModelLoadError(f"{source}: missing required key {key!r} for model_type {model_type!r}")
        return hf[key]

    arch = SUPPORTED_MODEL_TYPES[model_type]
    common = dict(
        architecture=arch,
        model_type=model_type,
        vocab_size=int(need("vocab_size")),
        hidden_size=int(need("hidden_size")),
        num_layers=int(need("num_hidden_layers")),
        num_heads=int(need("num_attention_heads")),
        bos_token_id=hf.get("bos_token_id"),
        eos_token_ids=tuple(_as_id_list(hf.get("eos_token_id"))),
        torch_dtype=_config_dtype(hf, source),
    )
    try:
        if arch == "opt":
            return _opt(hf, need, common)
        return _decoder(hf, source, need, common)
    except ModelLoadError as err:
        if str(err).startswith(source):
            raise
        raise ModelLoadError(f"{source}: {err}") from None


def _decoder(hf, source, need, common) -> ModelConfig:
    """The LLaMA-like families: Llama, Mistral, Qwen2, Qwen3, Phi-3, Gemma 2 and Gemma 3."""
    model_type, arch = common["model_type"], common["architecture"]
    act = hf.get("hidden_activation") or hf.get("hidden_act") or _ACTIVATIONS[arch][0]
    if act not in _ACTIVATIONS[arch]:
        raise ModelLoadError(f"{source}: hidden_act {act!r} is not supported for {model_type} "
                             f"(only {', '.join(map(repr, _ACTIVATIONS[arch]))})")
    gemma = arch == "gemma"
    theta, scaling, local_theta = _rope(hf, source, gemma)
    window, layer_types = _window(hf, model_type, common["num_layers"])
    bias = bool(hf.get("attention_bias", False))
    qwen2 = model_type == "qwen2"
    return ModelConfig(
        num_kv_heads=int(hf.get("num_key_value_heads") or common["num_heads"]),
        head_dim=int(hf.get("head_dim") or common["hidden_size"] // common["num_heads"]),
        intermediate_size=int(need("intermediate_size")),
        max_position_embeddings=int(hf.get("max_position_embeddings", 2048)),
        rope_theta=theta,
        rope_scaling=scaling,
        rope_local_theta=local_theta,
        rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
        qkv_bias=True if qwen2 else bias,
        o_bias=False if qwen2 else bias,
        mlp_bias=bool(hf.get("mlp_bias", False)) if model_type == "llama" else False,
        tie_word_embeddings=bool(hf.get("tie_word_embeddings", gemma)),
        sliding_window=window,
        layer_types=layer_types,
        hidden_act=act,
        qk_norm=model_type in ("qwen3", "gemma3_text"),
        query_pre_attn_scalar=float(need("query_pre_attn_scalar")) if gemma else None,
        attn_logit_softcapping=_cap(hf.get("attn_logit_softcapping")),
        final_logit_softcapping=_cap(hf.get("final_logit_softcapping")),
        **common,
    )


def _window(hf: dict, model_type: str, num_layers: int) -> tuple[int | None, tuple[str, ...] | None]:
    """``(sliding_window, layer_types)``: the window when some layer uses one, and which layers do
    (None: all of them)."""
    window, types = hf.get("sliding_window"), hf.get("layer_types")
    if model_type in ("qwen2", "qwen3"):  # Qwen ships a window but only uses it when asked to
        uses = hf.get("use_sliding_window") or "sliding_attention" in (types or [])
        window = window if uses else None
    elif model_type == "llama":
        window = None
    if not window:
        return None, None
    if model_type in ("gemma2", "gemma3_text") and not types:  # written before configs listed them
        pattern = 2 if model_type == "gemma2" else int(hf.get("sliding_window_pattern", 6))
        types = ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(num_layers)]
    if model_type in ("qwen2", "qwen3") and not types:  # Qwen slides from layer max_window_layers on
        first = int(hf.get("max_window_layers", 28))
        types = ["sliding_attention" if i >= first else "full_attention" for i in range(num_layers)]
    if set(types or ()) == {"full_attention"}:
        return None, None
    if not types or set(types) == {"sliding_attention"}:
        return int(window), None
    return int(window), tuple(types)


def _cap(value) -> float | None:
    return float(value) if value else None


def _opt(hf, need, common) -> ModelConfig:
    act = hf.get("activation_function", "relu")
    if act != "relu":
        raise ModelLoadError(f"activation_function {act!r} is not supported (only 'relu')")
    pre = bool(hf.get("do_layer_norm_before", True))
    bias = bool(hf.get("enable_bias", True))
    return ModelConfig(
        num_kv_heads=common["num_heads"],
        head_dim=common["hidden_size"] // common["num_heads"],
        intermediate_size=int(need("ffn_dim")),
        max_position_embeddings=int(hf.get("max_position_embeddings", 2048)),
        qkv_bias=bias,
        o_bias=bias,
        mlp_bias=bias,
        tie_word_embeddings=bool(hf.get("tie_word_embeddings", True)),
        word_embed_proj_dim=int(hf.get("word_embed_proj_dim") or common["hidden_size"]),
        do_layer_norm_before=pre,
        layer_norm_affine=bool(hf.get("layer_norm_elementwise_affine", True)),
        final_layer_norm=pre and not hf.get("_remove_final_layer_norm", False),
        **common,
    )


def _as_id_list(value: Any) -> list[int]:
    if value is None:
        return []
    if isinstance(value, int):
        return [value]
    return [int(v) for v in value]


def _config_dtype(hf: dict, source: str):
    raw = hf.get("torch_dtype", hf.get("dtype"))
    try:
        return parse_dtype(raw)
    except ValueError as err:
        raise ModelLoadError(f"{source}: {err}") from None


def _rope(hf: dict, source: str, gemma: bool) -> tuple[float, dict | None, float | None]:
    """``(rope_theta, rope_scaling, rope_local_theta)`` from either config dialect; refuses RoPE types not
    implemented. Gemma 3 in transformers 5 keeps one set of parameters per layer type: the global
    layers' go to ``rope_theta`` / ``rope_scaling``, the sliding layers' base to ``rope_local_theta``."""
    params = dict(hf.get("rope_parameters") or hf.get("rope_scaling") or {})
    local_theta = None
    if "full_attention" in params or "sliding_attention" in params:  # per layer type (Gemma 3, transformers 5)
        local = dict(params.get("sliding_attention") or {})
        if local.pop("rope_type", "default") != "default":
            raise ModelLoadError(f"{source}: RoPE scaling of the sliding-window layers is not supported")
        local_theta = float(local.get("rope_theta", 10000.0))
        params = dict(params.get("full_attention") or {})
    elif gemma and hf.get("model_type") == "gemma3_text":
        local_theta = float(hf.get("rope_local_base_freq", 10000.0))
    theta = float(params.pop("rope_theta", hf.get("rope_theta", 10000.0)))
    rope_type = params.pop("rope_type", params.pop("type", "default"))
    rope_type = "longrope" if rope_type == "su" else rope_type
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise ModelLoadError(
            f"{source}: rope type {rope_type!r} is not supported; supported: {', '.join(SUPPORTED_ROPE_TYPES)}"
        )
    if float(params.get("partial_rotary_factor", hf.get("partial_rotary_factor", 1.0))) != 1.0:
        raise ModelLoadError(f"{source}: partial_rotary_factor != 1 is not supported")
    if rope_type == "default":
        return theta, None, local_theta
    if rope_type == "longrope":
        return theta, _longrope(hf, params, source), local_theta
    required = {"linear": ["factor"], "llama3": ["factor", "low_freq_factor", "high_freq_factor"],
                "freq_factors": ["factors"]}
    missing = [k for k in required[rope_type] if k not in params]
    if missing:
        raise ModelLoadError(f"{source}: rope type {rope_type!r} needs {', '.join(missing)}")
    if rope_type == "llama3":
        params.setdefault("original_max_position_embeddings", hf.get("max_position_embeddings", 2048))
    params.pop("partial_rotary_factor", None)
    if rope_type == "freq_factors":
        params["factors"] = tuple(float(f) for f in params["factors"])
    return theta, {"rope_type": rope_type, **params}, local_theta


def _longrope(hf: dict, params: dict, source: str) -> dict:
    """Phi-3's LongRoPE, as transformers computes it for sequences within the original context: the
    short factors divide the frequencies and ``attention_factor`` scales cos and sin."""
    original = params.get("original_max_position_embeddings", hf.get("original_max_position_embeddings"))
    if original is None or "short_factor" not in params:
        raise ModelLoadError(f"{source}: rope type 'longrope' needs short_factor and original_max_position_embeddings")
    factor = params.get("factor") or hf.get("max_position_embeddings", original) / original
    attention = params.get("attention_factor")
    if attention is None:
        attention = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))
    return {"rope_type": "longrope", "short_factor": tuple(float(f) for f in params["short_factor"]),
            "attention_factor": float(attention), "original_max_position_embeddings": int(original)}
