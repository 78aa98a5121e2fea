"""The LLaMA family (Llama 2/3, Mistral, Qwen2, Qwen3, Phi-3) over a pluggable attention.

A pre-norm decoder: ``h += attn(rmsnorm(h)); h += mlp(rmsnorm(h))`` with
rotary positions, grouped-query attention (H_kv <= H key/value heads) and a
SwiGLU MLP ``down(silu(gate(x)) * up(x))``. The members differ only in
config: Qwen2 has q/k/v biases, Llama may have ``attention_bias`` /
``mlp_bias``, Qwen3 RMS-normalises each head of q and k before RoPE
(``qk_norm``), Mistral and Phi-3 attend over a sliding window. q/k/v run as
one GEMM (``qkv_proj``), gate/up as one GEMM (``gate_up_proj``); Phi-3's
checkpoint stores them fused already (``Phi3ForCausalLM``).

The residual stream is carried beside the layer output, as vLLM does: each
RMSNorm adds the block output to the residual and normalises the sum in one
step (``RMSNorm.add_and_norm``), which on a CPU is one fused pass. The sums
are the same ``h + block(h)`` in the same dtype, so the eager path is
bitwise the plain pre-norm formula.
"""

from __future__ import annotations

import torch
from torch import nn

from paged.models.attention import Attention, attention_options
from paged.models.base import CausalLM
from paged.models.config import ModelConfig
from paged.models.layers import Embedding, Linear, MergedLinear, RMSNorm, RotaryEmbedding, silu_and_mul
from paged.models.unrolled import UnrolledLlama, unrolled


class LlamaAttention(nn.Module):
    """Fused q/k/v projection, RoPE on q and k, the pluggable attention, output projection.

    Args:
        config: the model's config.
        rotary: the RoPE table shared by the layers.
        window: this layer's sliding window, or None.
    """

    def __init__(self, config: ModelConfig, rotary: RotaryEmbedding, window: int | None = None):
        super().__init__()
        h, h_kv, d = config.num_heads, config.num_kv_heads, config.head_dim
        self.num_heads, self.num_kv_heads, self.head_dim = h, h_kv, d
        self.scale, self.window = config.softmax_scale, window
        self.qkv_proj = MergedLinear(config.hidden_size, (h * d, h_kv * d, h_kv * d), bias=config.qkv_bias)
        self.o_proj = Linear(h * d, config.hidden_size, bias=config.o_bias)
        self.q_norm = RMSNorm(d, config.rms_norm_eps) if config.qk_norm else None
        self.k_norm = RMSNorm(d, config.rms_norm_eps) if config.qk_norm else None
        self.rotary = [rotary]  # shared by all layers; a list so it is not registered L times

    # --8<-- [start:attention]
    def forward(self, layer: int, x: torch.Tensor, positions: torch.Tensor, attention: Attention, longest: int):
        """``[T, hidden]`` -> ``[T, hidden]``; ``longest``: one past the largest position in ``positions``."""
        t = x.shape[0]
        q, k, v = self.qkv_proj.split(self.qkv_proj(x))
        q = q.reshape(t, self.num_heads, self.head_dim)  # [T, H, D]
        k = k.reshape(t, self.num_kv_heads, self.head_dim)  # [T, H_kv, D]
        if self.q_norm is not None:  # Qwen3: each head normalised before it is rotated
            q, k = self.q_norm(q), self.k_norm(k)
        rotary = self.rotary[0]
        q, k = rotary(q, positions), rotary(k, positions)
        v = v.view(t, self.num_kv_heads, self.head_dim)  # [T, H_kv, D]
        out = attention(layer, q, k, v, self.scale, **attention_options(self.window, longest, None))  # [T, H, D]
        return self.o_proj(out.reshape(t, self.num_heads * self.head_dim))

    # --8<-- [end:attention]


class LlamaMLP(nn.Module):
    """SwiGLU: ``down_proj(silu(gate) * up)`` with gate and up from one GEMM."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        i = config.intermediate_size
        self.gate_up_proj = MergedLinear(config.hidden_size, (i, i), bias=config.mlp_bias)
        self.down_proj = Linear(i, config.hidden_size, bias=config.mlp_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [T, hidden] -> [T, hidden]
        return self.down_proj(silu_and_mul(self.gate_up_proj(x)))


class LlamaDecoderLayer(nn.Module):
    """Pre-norm residual block: attention then MLP."""

    def __init__(self, config: ModelConfig, rotary: RotaryEmbedding, window: int | None = None):
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = LlamaAttention(config, rotary, window)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = LlamaMLP(config)

    # --8<-- [start:layer]
    def forward(self, layer, h, residual, positions, attention, longest):  # h, residual: [T, hidden]
        """``h`` is the previous block's output and ``residual`` the stream before it (None
        at layer 0, where ``h`` is the embedding); returns this layer's MLP output and the
        stream before it. Written out: ``h += attn(norm(h)); h += mlp(norm(h))``."""
        if residual is None:
            x, residual = self.input_layernorm(h), h
        else:
            x, residual = self.input_layernorm.add_and_norm(h, residual)
        x = self.self_attn(layer, x, positions, attention, longest)
        x, residual = self.post_attention_layernorm.add_and_norm(x, residual)
        return self.mlp(x), residual

    # --8<-- [end:layer]


class LlamaModel(nn.Module):
    """Token embedding, the decoder layers, final RMSNorm."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.embed_tokens = Embedding(config.vocab_size, config.hidden_size)
        self.rotary_emb = RotaryEmbedding(config)
        self.layers = nn.ModuleList(LlamaDecoderLayer(config, self.rotary_emb, config.window(i))
                                    for i in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.windowed = config.sliding_window is not None

    def forward(self, input_ids, positions, attention):  # [T], [T] -> [T, hidden]
        longest = int(positions.max()) + 1 if self.windowed and len(positions) else 0  # where a window may cut
        h, residual = self.embed_tokens(input_ids), None
        for i, layer in enumerate(self.layers):
            h, residual = layer(i, h, residual, positions, attention, longest)
        return self.norm.add_and_norm(h, residual)[0]


class LlamaForCausalLM(CausalLM):
    """Llama / Mistral / Qwen2 / Qwen3 causal LM; see ``CausalLM`` for the calling convention.

    Args:
        config: a ``ModelConfig`` with ``architecture == "llama"``.
    """

    architecture = "llama"
    packed_modules = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}
    tp_plan = {"qkv_proj": "column", "o_proj": "row", "gate_up_proj": "column", "down_proj": "row"}

    def __init__(self, config: ModelConfig):
        super().__init__()
        if config.architecture != self.architecture:
            raise ValueError(f"{type(self).__name__} needs a {self.architecture!r} config, got {config.architecture!r}")
        self.config = config
        self.model = LlamaModel(config)
        self.lm_head = Linear(config.hidden_size, config.vocab_size, bias=False)
        self.tie_weights()

    def get_input_embeddings(self) -> nn.Embedding:
        """The token embedding module."""
        return self.model.embed_tokens

    def unroll(self) -> UnrolledLlama | None:
        """``LlamaModel.forward`` as one loop of kernel calls (``paged.models.unrolled``), where the kernels
        allow it and every norm is an ``RMSNorm`` as ``layers.py`` defines it."""
        norms = [self.model.norm]
        for layer in self.model.layers:
            norms += [layer.input_layernorm, layer.post_attention_layernorm]
            norms += [n for n in (layer.self_attn.q_norm, layer.self_attn.k_norm) if n is not None]
        return unrolled(self, UnrolledLlama, norms, RMSNorm)


class Phi3ForCausalLM(LlamaForCausalLM):
    """Phi-3: the LLaMA layer, with ``qkv_proj`` and ``gate_up_proj`` fused in the checkpoint itself (so
    each fills in one piece) and LongRoPE (``ModelConfig.rope_scaling``). Not shardable: a rank's slice
    of a fused checkpoint tensor is several pieces of it."""

    architecture = "phi3"
    packed_modules = {}
    tp_plan = {}
