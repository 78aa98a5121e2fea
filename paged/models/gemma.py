"""Gemma 2 and Gemma 3 (text) over a pluggable attention.

What they add to the LLaMA layer (``llama.py``):

* **RMSNorm with a +1 offset**, computed in float32: ``x / rms(x) * (1 + w)``
  (``GemmaRMSNorm``; the checkpoint stores ``w``, llama.cpp's GGUF files ``1 + w``);
* **sandwich norms**: each block's output is normalised too before it joins the
  residual stream: ``h += norm(attn(norm(h))); h += norm(mlp(norm(h)))``;
* **GeGLU**: ``down(gelu_tanh(gate) * up)``;
* the **embedding scaled** by ``sqrt(hidden)`` (rounded to the model's dtype), the
  LM head tied to it;
* the softmax scale ``query_pre_attn_scalar ** -0.5``;
* **interleaved sliding-window and global layers** (``ModelConfig.layer_types``):
  Gemma 2 alternates them, Gemma 3 has five sliding layers to one global; a
  sliding layer's query sees the last ``sliding_window`` positions only;
* Gemma 2: attention scores and final logits **soft-capped**
  (``cap * tanh(s / cap)``); Gemma 3: per-head **q/k norms** instead, and its
  sliding layers rotate with their own RoPE base (``rope_local_theta``).
"""

from __future__ import annotations

import torch
from torch import nn

from paged.models.attention import Attention, attention_options
from paged.models.base import CausalLM
from paged.kernels.cpu import fused_ops
from paged.models.config import ModelConfig
from paged.models.layers import Embedding, Linear, MergedLinear, RotaryEmbedding, gelu_and_mul
from paged.models.unrolled import UnrolledGemma, unrolled


class GemmaRMSNorm(nn.Module):
    """``x / sqrt(mean(x**2) + eps) * (1 + weight)`` over the last dim, in float32, cast back to x's dtype."""

    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [..., N] -> [..., N]
        ops = fused_ops(x)
        if ops is not None:  # the fused op takes rows: [T, N] (or [T * H, N] for the per-head q/k norms)
            return ops.gemma_rms_norm(x.reshape(-1, x.shape[-1]), None, self.weight, self.eps).view(x.shape)
        return self.eager(x)

    def norm_and_add(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        """``residual + norm(x)``: a sandwich norm's output joining the residual stream ([T, N] both)."""
        ops = fused_ops(x)
        if ops is not None:
            return ops.gemma_rms_norm(x, residual, self.weight, self.eps)
        return residual + self.eager(x)

    def eager(self, x: torch.Tensor) -> torch.Tensor:
        """The formula, one PyTorch operation at a time (what the fused op is tested against)."""
        y = x.float()
        y = y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + self.eps)
        return (y * (1.0 + self.weight.float())).type_as(x)


class GemmaAttention(nn.Module):
    """q/k/v in one GEMM, Gemma 3's per-head q/k norms, RoPE (the sliding layers' own table on Gemma 3),
    the pluggable attention with this layer's window and soft-cap, the output projection."""

    def __init__(self, config: ModelConfig, rotary: RotaryEmbedding, window: int | None):
        super().__init__()
        h, h_kv, d = config.num_heads, config.num_kv_heads, config.head_dim
        self.num_heads, self.num_kv_heads, self.head_dim = h, h_kv, d
        self.scale, self.window, self.softcap = config.softmax_scale, window, config.attn_logit_softcapping
        self.qkv_proj = MergedLinear(config.hidden_size, (h * d, h_kv * d, h_kv * d), bias=config.qkv_bias)
        self.o_proj = Linear(h * d, config.hidden_size, bias=config.o_bias)
        self.q_norm = GemmaRMSNorm(d, config.rms_norm_eps) if config.qk_norm else None
        self.k_norm = GemmaRMSNorm(d, config.rms_norm_eps) if config.qk_norm else None
        self.rotary = [rotary]  # shared with the other layers of its kind; not registered here

    def forward(self, layer: int, x: torch.Tensor, positions: torch.Tensor, attention: Attention, longest: int):
        """``[T, hidden]`` -> ``[T, hidden]``; ``longest``: one past the largest position in ``positions``."""
        t = x.shape[0]
        q, k, v = self.qkv_proj.split(self.qkv_proj(x))
        q = q.reshape(t, self.num_heads, self.head_dim)  # [T, H, D]
        k = k.reshape(t, self.num_kv_heads, self.head_dim)  # [T, H_kv, D]
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = self.rotary[0](q, positions), self.rotary[0](k, positions)
        v = v.reshape(t, self.num_kv_heads, self.head_dim)
        options = attention_options(self.window, longest, self.softcap)
        out = attention(layer, q, k, v, self.scale, **options)  # [T, H, D]
        return self.o_proj(out.reshape(t, self.num_heads * self.head_dim))


class GemmaMLP(nn.Module):
    """GeGLU: ``down_proj(gelu_tanh(gate) * up)`` with gate and up from one GEMM."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        i = config.intermediate_size
        self.gate_up_proj = MergedLinear(config.hidden_size, (i, i), bias=False)
        self.down_proj = Linear(i, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [T, hidden] -> [T, hidden]
        return self.down_proj(gelu_and_mul(self.gate_up_proj(x)))


class GemmaDecoderLayer(nn.Module):
    """``h += norm(attn(norm(h))); h += norm(mlp(norm(h)))`` (four norms, named as transformers names them)."""

    def __init__(self, config: ModelConfig, rotary: RotaryEmbedding, window: int | None):
        super().__init__()
        size, eps = config.hidden_size, config.rms_norm_eps
        self.input_layernorm = GemmaRMSNorm(size, eps)
        self.self_attn = GemmaAttention(config, rotary, window)
        self.post_attention_layernorm = GemmaRMSNorm(size, eps)
        self.pre_feedforward_layernorm = GemmaRMSNorm(size, eps)
        self.mlp = GemmaMLP(config)
        self.post_feedforward_layernorm = GemmaRMSNorm(size, eps)

    def forward(self, layer, h, positions, attention, longest):  # [T, hidden] -> [T, hidden]
        x = self.self_attn(layer, self.input_layernorm(h), positions, attention, longest)
        h = self.post_attention_layernorm.norm_and_add(x, h)
        return self.post_feedforward_layernorm.norm_and_add(self.mlp(self.pre_feedforward_layernorm(h)), h)


class GemmaModel(nn.Module):
    """Scaled token embedding, the decoder layers, final norm."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.embed_tokens = Embedding(config.vocab_size, config.hidden_size)
        self.rotary_emb = RotaryEmbedding(config)
        # Gemma 3's sliding layers rotate with a base of their own
        self.rotary_local = RotaryEmbedding(config, local=True) if config.rope_local_theta else None
        self.layers = nn.ModuleList(
            GemmaDecoderLayer(config, self._rotary(config, i), config.window(i)) for i in range(config.num_layers))
        self.norm = GemmaRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.normalizer = config.hidden_size**0.5
        self.windowed = config.sliding_window is not None

    def _rotary(self, config: ModelConfig, layer: int) -> RotaryEmbedding:
        sliding = config.window(layer) is not None
        return self.rotary_local if sliding and self.rotary_local is not None else self.rotary_emb

    def forward(self, input_ids, positions, attention):  # [T], [T] -> [T, hidden]
        longest = int(positions.max()) + 1 if self.windowed and len(positions) else 0  # where a window may cut
        h = self.embed_tokens(input_ids)  # [T, hidden]
        h = h * torch.tensor(self.normalizer, dtype=h.dtype)  # sqrt(hidden) rounded to the model's dtype first
        for i, layer in enumerate(self.layers):
            h = layer(i, h, positions, attention, longest)
        return self.norm(h)


class GemmaForCausalLM(CausalLM):
    """Gemma 2 / Gemma 3 (text) causal LM; see ``CausalLM`` for the calling convention.

    Args:
        config: a ``ModelConfig`` with ``architecture == "gemma"``.
    """

    packed_modules = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}
    tp_plan = {"qkv_proj": "column", "o_proj": "row", "gate_up_proj": "column", "down_proj": "row"}

    def __init__(self, config: ModelConfig):
        super().__init__()
        if config.architecture != "gemma":
            raise ValueError(f"GemmaForCausalLM needs a gemma config, got {config.architecture!r}")
        self.config = config
        self.model = GemmaModel(config)
        self.lm_head = Linear(config.hidden_size, config.vocab_size, bias=False)
        self.tie_weights()

    def get_input_embeddings(self) -> nn.Embedding:
        """The token embedding module."""
        return self.model.embed_tokens

    def unroll(self) -> UnrolledGemma | None:
        """``GemmaModel.forward`` as one loop of kernel calls (``paged.models.unrolled``), where the kernels
        allow it and every norm is a ``GemmaRMSNorm`` as defined here."""
        norms = [self.model.norm]
        for layer in self.model.layers:
            norms += [layer.input_layernorm, layer.post_attention_layernorm, layer.pre_feedforward_layernorm,
                      layer.post_feedforward_layernorm]
            norms += [n for n in (layer.self_attn.q_norm, layer.self_attn.k_norm) if n is not None]
        return unrolled(self, UnrolledGemma, norms, GemmaRMSNorm)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:  # [T', hidden] -> [T', V]
        logits = self.lm_head(hidden)
        cap = self.config.final_logit_softcapping
        return logits if cap is None else torch.tanh(logits / cap) * cap
