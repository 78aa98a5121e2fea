"""What a Hugging Face ``config.json`` says about a model, in one dataclass.

``ModelConfig`` is the only thing the model definitions read. It is parsed
from the ``config.json`` of a checkpoint folder (``ModelConfig.from_hf``),
which comes in two dialects: transformers 4 writes ``rope_theta`` and
``rope_scaling`` at the top level and ``torch_dtype``; transformers 5 writes
``rope_parameters`` and ``dtype``. Both are read.

Invariants: ``num_heads % num_kv_heads == 0``; ``rope_scaling`` is ``None`` or
a dict whose ``rope_type`` is ``"linear"`` or ``"llama3"``; anything this
package cannot run exactly raises ``ModelLoadError`` here, before a single
weight is read.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import torch


class ModelLoadError(ValueError):
    """A checkpoint folder this package cannot load; the message names the file and the problem."""


# model_type -> architecture family that implements it.
SUPPORTED_MODEL_TYPES = {"llama": "llama", "mistral": "llama", "qwen2": "llama", "opt": "opt"}
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")
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


def _as_id_list(value: Any) -> list[int]:
    if value is None:
        return []
    if isinstance(value, int):
        return [value]
    return [int(v) for v in value]


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """The shape and the numerics of a decoder-only model.

    Attributes:
        architecture: ``"llama"`` (Llama, Mistral, Qwen2) or ``"opt"``.
        model_type: ``config.json``'s ``model_type`` (``"llama"``, ``"mistral"``, ``"qwen2"``, ``"opt"``).
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
        rope_scaling: ``None`` or ``{"rope_type": "linear" | "llama3", ...}`` with that type's parameters.
        rms_norm_eps: epsilon of RMSNorm (LLaMA family).
        qkv_bias: q/k/v projections have a bias (Qwen2 always, Llama with ``attention_bias``, OPT with
            ``enable_bias``).
        o_bias: the output projection has a bias.
        mlp_bias: the MLP projections have biases.
        tie_word_embeddings: the LM head reuses the token embedding matrix.
        bos_token_id: beginning-of-sequence id or None.
        eos_token_ids: end-of-sequence ids from ``config.json`` (``generation_config.json`` may override).
        torch_dtype: the dtype the checkpoint was saved in, or None.
        sliding_window: Mistral / Qwen2 sliding-window size when the model uses one, else None. Not
            implemented as a mask: ``max_model_len`` is capped at the window instead, where full
            causal attention and sliding-window attention are the same thing.
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

    @property
    def max_model_len(self) -> int:
        """Longest sequence (prompt + output) this package runs exactly for this model."""
        return min(self.max_position_embeddings, self.sliding_window or math.inf)

    @classmethod
    def from_hf(cls, hf: dict, source: str = "config.json") -> ModelConfig:
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
            raise ModelLoadError(
                f"{source}: model_type {model_type!r} is not supported; "
                f"supported: {', '.join(sorted(SUPPORTED_MODEL_TYPES))}"
            )

        def need(key):
            if hf.get(key) is None:
                raise ModelLoadError(f"{source}: missing required key {key!r} for model_type {model_type!r}")
            return hf[key]

        arch = SUPPORTED_MODEL_TYPES[model_type]
        common = dict(
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
                return cls._opt(hf, source, need, common)
            return cls._llama(hf, source, need, common)
        except ModelLoadError as err:
            if str(err).startswith(source):
                raise
            raise ModelLoadError(f"{source}: {err}") from None

    @classmethod
    def _llama(cls, hf, source, need, common) -> ModelConfig:
        act = hf.get("hidden_act", "silu")
        if act != "silu":
            raise ModelLoadError(f"{source}: hidden_act {act!r} is not supported (only 'silu')")
        model_type = common["model_type"]
        theta, scaling = _rope(hf, source)
        window = hf.get("sliding_window")
        if model_type == "qwen2":  # Qwen2 ships a window but only uses it when asked to
            uses = hf.get("use_sliding_window") or "sliding_attention" in (hf.get("layer_types") or [])
            window = window if uses else None
        elif model_type == "llama":
            window = None
        bias = bool(hf.get("attention_bias", False))
        return cls(
            architecture="llama",
            num_kv_heads=int(hf.get("num_key_value_heads") or common["num_heads"]),
            head_dim=int(hf.get("head_dim") or common["hidden_size"] // common["num_heads"]),
            intermediate_size=int(need("intermediate_size")),
            max_position_embeddings=int(hf.get("max_position_embeddings", 2048)),
            rope_theta=theta,
            rope_scaling=scaling,
            rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
            qkv_bias=True if model_type == "qwen2" else bias,
            o_bias=False if model_type == "qwen2" else bias,
            mlp_bias=bool(hf.get("mlp_bias", False)) if model_type == "llama" else False,
            tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
            sliding_window=int(window) if window else None,
            **common,
        )

    @classmethod
    def _opt(cls, hf, source, need, common) -> ModelConfig:
        act = hf.get("activation_function", "relu")
        if act != "relu":
            raise ModelLoadError(f"{source}: activation_function {act!r} is not supported (only 'relu')")
        pre = bool(hf.get("do_layer_norm_before", True))
        bias = bool(hf.get("enable_bias", True))
        return cls(
            architecture="opt",
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


def _config_dtype(hf: dict, source: str) -> torch.dtype | None:
    raw = hf.get("torch_dtype", hf.get("dtype"))
    try:
        return parse_dtype(raw)
    except ValueError as err:
        raise ModelLoadError(f"{source}: {err}") from None


def _rope(hf: dict, source: str) -> tuple[float, dict | None]:
    """(rope_theta, rope_scaling) from either config dialect; refuses RoPE types not implemented."""
    params = dict(hf.get("rope_parameters") or hf.get("rope_scaling") or {})
    theta = float(params.pop("rope_theta", hf.get("rope_theta", 10000.0)))
    rope_type = params.pop("rope_type", params.pop("type", "default"))
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise ModelLoadError(
            f"{source}: rope type {rope_type!r} is not supported; supported: {', '.join(SUPPORTED_ROPE_TYPES)}"
        )
    if float(params.get("partial_rotary_factor", 1.0)) != 1.0:
        raise ModelLoadError(f"{source}: partial_rotary_factor != 1 is not supported")
    if rope_type == "default":
        return theta, None
    required = {"linear": ["factor"], "llama3": ["factor", "low_freq_factor", "high_freq_factor"]}
    missing = [k for k in required[rope_type] if k not in params]
    if missing:
        raise ModelLoadError(f"{source}: rope type {rope_type!r} needs {', '.join(missing)}")
    if rope_type == "llama3":
        params.setdefault("original_max_position_embeddings", hf.get("max_position_embeddings", 2048))
    return theta, {"rope_type": rope_type, **params}
