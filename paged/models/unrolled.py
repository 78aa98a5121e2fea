"""The forward pass unrolled: a model's kernel calls in one flat loop, chosen once (LLaMA family, Gemma, OPT).

Serving a small model on a CPU, a forward pass of one new token spends a third of its time
in Python rather than in kernels. Each of SmolLM2's 121 linear layers, 61 norms and 30
attention calls goes through ``nn.Module.__call__`` (hooks, tracing checks), then its
module's ``forward``, which asks again at every call which path it takes (a fused op? a
packed weight? the quantized kernel? how many rows?), and every attribute it reads goes
through ``nn.Module.__getattr__``. A GPU engine removes the same kind of cost with CUDA
graphs: vLLM records a decode step's kernel launches once and replays them. Here the
answers are found once, when serving starts (``CausalLM.prepare_for_serving``): each linear
becomes the one kernel call its ``forward`` would make (``linear_call``), the norms, RoPE
and SiLU-and-mul their fused ops, and a layer a tuple that one loop reads.

The calls are the modules' own, with the same inputs in the same order, so the hidden states
are the same bits (``tests/models/test_unrolled.py``). ``llama.py``, ``gemma.py`` and ``opt.py`` stay the
code to read; this is their fast path, entered only by ``CausalLM.forward`` (the one seam), only under
``torch.inference_mode()`` and while no module has a hook; ``PAGED_UNROLLED=0`` turns it off.
"""

from __future__ import annotations

import os
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from paged.kernels import cpu as cpu_kernels
from paged.models.attention import Attention, attention_options
from paged.models.layers import Linear, gelu_and_mul
from paged.models.quantized import QuantizedLinear

UNROLLED = os.environ.get("PAGED_UNROLLED", "1") != "0"  # False: every forward pass through the modules


def linear_call(layer: nn.Module) -> Callable[[torch.Tensor], torch.Tensor]:
    """What ``layer(x)`` computes, as one call chosen now (after ``prepare_for_serving``): a ``Linear``'s or a
    ``QuantizedLinear``'s ``kernel_call`` where the layer has one (the kernel its ``forward`` takes at
    every row count); else the module's own ``forward``, minus ``nn.Module.__call__`` (a oneDNN-packed
    weight, a lone row padded to two, a tensor-parallel shard, a subclass or an instance with a
    ``forward`` of its own)."""
    own = type(layer).forward in (Linear.forward, QuantizedLinear.forward) and "forward" not in vars(layer)
    return (layer.kernel_call() if own else None) or layer.forward


def plain(modules: list[nn.Module], cls: type) -> bool:
    """Whether every module is exactly a ``cls`` with that class's ``forward``: what a model's loop repeats
    (its ``unroll`` asks it of its norms)."""
    return all(type(m) is cls and "forward" not in vars(m) for m in modules)


class Unrolled:
    """What every unrolled pass shares: where it may run (``applies``). A model's ``unroll`` builds its own
    (``UnrolledLlama``, ``UnrolledGemma``, ``UnrolledOPT``; through ``unrolled``), once its modules are ready
    to serve."""

    def __init__(self, model: nn.Module, ops) -> None:
        self.ops = ops
        # every module's hook dicts (register_forward_hook and its kin add to these same dicts): one any() of
        # them is a pass's check, where looking each module up again took a fifth of a millisecond
        self.hooks = [d for m in model.modules() for d in (m._forward_hooks, m._forward_pre_hooks)]

    def applies(self) -> bool:
        """Whether a pass may take this loop: under inference mode with the fused ops on (the modules'
        condition for them) and while no module has a forward hook (the loop calls no module, so it would
        run none)."""
        if not (torch.is_inference_mode_enabled() and cpu_kernels.FUSED_OPS):
            return False
        if nn.modules.module._global_forward_hooks or nn.modules.module._global_forward_pre_hooks:
            return False
        return not any(self.hooks)


class UnrolledLlama(Unrolled):
    """``LlamaModel.forward`` (``llama.py``: Llama, Mistral, Qwen2, Qwen3, Phi-3) for a model made ready to
    serve on a CPU, as one loop.

    Built by ``LlamaForCausalLM.unroll`` where it applies; called as the trunk is, ``(input_ids,
    positions, attention) -> hidden``, by ``CausalLM.forward`` when ``applies()``.
    """

    def __init__(self, model: nn.Module, ops) -> None:
        super().__init__(model, ops)
        trunk = model.model
        self.embed = trunk.embed_tokens.forward
        self.rotary = trunk.rotary_emb  # its cos/sin tables are read at every pass (reset_table may replace them)
        self.windowed = trunk.windowed
        self.final = (trunk.norm.weight, trunk.norm.eps)
        self.layers = []
        for i, layer in enumerate(trunk.layers):
            attn, mlp = layer.self_attn, layer.mlp
            qk_norms = None if attn.q_norm is None else ((attn.q_norm.weight, attn.q_norm.eps),
                                                         (attn.k_norm.weight, attn.k_norm.eps))
            self.layers.append((
                i, layer.input_layernorm.weight, layer.input_layernorm.eps,
                linear_call(attn.qkv_proj), attn.qkv_proj.output_sizes,
                attn.num_heads, attn.num_kv_heads, attn.head_dim, qk_norms, attn.scale, attn.window,
                linear_call(attn.o_proj),
                layer.post_attention_layernorm.weight, layer.post_attention_layernorm.eps,
                linear_call(mlp.gate_up_proj), linear_call(mlp.down_proj),
            ))

    def __call__(self, input_ids: torch.Tensor, positions: torch.Tensor, attention: Attention) -> torch.Tensor:
        ops, t = self.ops, input_ids.shape[0]
        cos, sin = self.rotary.cos, self.rotary.sin
        longest = int(positions.max()) + 1 if self.windowed and len(positions) else 0
        h, residual = self.embed(input_ids), None
        for (i, in_weight, in_eps, qkv_proj, sizes, heads, kv_heads, head_dim, qk_norms, scale, window, o_proj,
             post_weight, post_eps, gate_up_proj, down_proj) in self.layers:
            if residual is None:  # layer 0: the norm of the embedding, which is the residual stream
                x, residual = ops.add_rms_norm(h, None, in_weight, in_eps)[0], h
            else:
                x, residual = ops.add_rms_norm(h, residual, in_weight, in_eps)
            q, k, v = qkv_proj(x).split(sizes, dim=-1)
            q = q.reshape(t, heads, head_dim)
            k = k.reshape(t, kv_heads, head_dim)
            if qk_norms is not None:  # Qwen3: each head normalised, as RMSNorm.forward takes rows
                (qw, qe), (kw, ke) = qk_norms
                q = ops.add_rms_norm(q.reshape(-1, head_dim), None, qw, qe)[0].view(q.shape)
                k = ops.add_rms_norm(k.reshape(-1, head_dim), None, kw, ke)[0].view(k.shape)
            ops.rotary_(q, positions, cos, sin)  # in place, as RotaryEmbedding.forward on the CPU
            ops.rotary_(k, positions, cos, sin)
            out = attention(i, q, k, v.view(t, kv_heads, head_dim), scale,
                            **attention_options(window, longest, None))
            x, residual = ops.add_rms_norm(o_proj(out.reshape(t, heads * head_dim)), residual, post_weight, post_eps)
            h = down_proj(ops.silu_and_mul(gate_up_proj(x)))
        return ops.add_rms_norm(h, residual, *self.final)[0]


class UnrolledGemma(Unrolled):
    """``GemmaModel.forward`` (``gemma.py``: Gemma 2 and 3) for a model made ready to serve on a CPU, as one
    loop: four norms a layer (``gemma_rms_norm``, ``1 + w``; the two after the blocks add the residual),
    Gemma 3's per-head q/k norms, each layer's own RoPE table, window and soft-cap."""

    def __init__(self, model: nn.Module, ops) -> None:
        super().__init__(model, ops)
        trunk = model.model
        self.embed = trunk.embed_tokens.forward
        self.normalizer = trunk.normalizer
        self.windowed = trunk.windowed
        self.final = (trunk.norm.weight, trunk.norm.eps)
        self.layers = []

        def norm(n):
            return n.weight, n.eps

        for i, layer in enumerate(trunk.layers):
            attn, mlp = layer.self_attn, layer.mlp
            self.layers.append((
                i, norm(layer.input_layernorm), linear_call(attn.qkv_proj), attn.qkv_proj.output_sizes,
                attn.num_heads, attn.num_kv_heads, attn.head_dim,
                None if attn.q_norm is None else (norm(attn.q_norm), norm(attn.k_norm)),
                attn.rotary[0], attn.scale, attn.window, attn.softcap, linear_call(attn.o_proj),
                norm(layer.post_attention_layernorm), norm(layer.pre_feedforward_layernorm),
                linear_call(mlp.gate_up_proj), linear_call(mlp.down_proj), norm(layer.post_feedforward_layernorm),
            ))

    def __call__(self, input_ids: torch.Tensor, positions: torch.Tensor, attention: Attention) -> torch.Tensor:
        ops, t = self.ops, input_ids.shape[0]
        longest = int(positions.max()) + 1 if self.windowed and len(positions) else 0
        h = self.embed(input_ids)
        h = h * torch.tensor(self.normalizer, dtype=h.dtype)  # as GemmaModel.forward: the factor rounded first
        for (i, (in_weight, in_eps), qkv_proj, sizes, heads, kv_heads, head_dim, qk_norms, rotary, scale, window,
             softcap, o_proj, post_attn, pre_ff, gate_up_proj, down_proj, post_ff) in self.layers:
            q, k, v = qkv_proj(ops.gemma_rms_norm(h, None, in_weight, in_eps)).split(sizes, dim=-1)
            q = q.reshape(t, heads, head_dim)
            k = k.reshape(t, kv_heads, head_dim)
            if qk_norms is not None:  # Gemma 3: each head normalised, as GemmaRMSNorm.forward takes rows
                (qw, qe), (kw, ke) = qk_norms
                q = ops.gemma_rms_norm(q.reshape(-1, head_dim), None, qw, qe).view(q.shape)
                k = ops.gemma_rms_norm(k.reshape(-1, head_dim), None, kw, ke).view(k.shape)
            ops.rotary_(q, positions, rotary.cos, rotary.sin)  # in place, as RotaryEmbedding.forward on the CPU
            ops.rotary_(k, positions, rotary.cos, rotary.sin)
            out = attention(i, q, k, v.reshape(t, kv_heads, head_dim), scale,
                            **attention_options(window, longest, softcap))
            h = ops.gemma_rms_norm(o_proj(out.reshape(t, heads * head_dim)), h, *post_attn)
            x = gate_up_proj(ops.gemma_rms_norm(h, None, *pre_ff))
            h = ops.gemma_rms_norm(down_proj(gelu_and_mul(x)), h, *post_ff)
        return ops.gemma_rms_norm(h, None, *self.final)


class UnrolledOPT(Unrolled):
    """``OPTDecoder.forward`` (``opt.py``: the paper's model) for a model made ready to serve on a CPU, as one
    loop: learned positions, LayerNorms before the blocks (pre-LN, 125m-style) or after them (post-LN, 350m),
    a ReLU MLP, biases. Its norms are torch's ``nn.LayerNorm``, called as its ``forward`` calls them."""

    def __init__(self, model: nn.Module, ops, position_offset: int) -> None:
        super().__init__(model, ops)
        decoder = model.model.decoder
        self.position_offset = position_offset  # OPT's table starts at row 2 (opt.POSITION_OFFSET)
        self.embed, self.embed_positions = decoder.embed_tokens.forward, decoder.embed_positions.forward
        self.project_in = None if decoder.project_in is None else linear_call(decoder.project_in)

        def norm(n):
            return n.normalized_shape, n.weight, n.bias, n.eps

        self.final = None if decoder.final_layer_norm is None else norm(decoder.final_layer_norm)
        self.layers = []
        for i, layer in enumerate(decoder.layers):
            attn = layer.self_attn
            self.layers.append((
                i, layer.pre_norm, norm(layer.self_attn_layer_norm), linear_call(attn.qkv_proj),
                attn.qkv_proj.output_sizes, attn.num_heads, attn.head_dim, attn.scale, linear_call(attn.out_proj),
                norm(layer.final_layer_norm), linear_call(layer.fc1), linear_call(layer.fc2),
            ))

    def __call__(self, input_ids: torch.Tensor, positions: torch.Tensor, attention: Attention) -> torch.Tensor:
        t = input_ids.shape[0]
        x = self.embed(input_ids)
        if self.project_in is not None:
            x = self.project_in(x)
        h = x + self.embed_positions(positions + self.position_offset)
        for i, pre, attn_norm, qkv_proj, sizes, heads, head_dim, scale, out_proj, mlp_norm, fc1, fc2 in self.layers:
            x = F.layer_norm(h, *attn_norm) if pre else h
            q, k, v = (p.view(t, heads, head_dim) for p in qkv_proj(x).split(sizes, dim=-1))
            h = h + out_proj(attention(i, q, k, v, scale).reshape(t, heads * head_dim))
            if not pre:
                h = F.layer_norm(h, *attn_norm)
            x = F.layer_norm(h, *mlp_norm) if pre else h
            h = h + fc2(F.relu(fc1(x)))
            if not pre:
                h = F.layer_norm(h, *mlp_norm)
        return F.layer_norm(h, *self.final) if self.final is not None else h


def unrolled(model: nn.Module, cls: type, norms: list[nn.Module], norm_class: type, *args) -> Unrolled | None:
    """``cls(model, ops, *args)``, a model's unrolled pass, where one may be built: the pass may be unrolled
    at all (``fused_kernels``) and every norm the loop repeats is exactly a ``norm_class`` (``plain``); else
    None. What each model's ``unroll`` returns, given its norms."""
    ops = fused_kernels(model)
    if ops is None or not plain(norms, norm_class):
        return None
    return cls(model, ops, *args)


def fused_kernels(model: nn.Module):
    """The compiled CPU kernels, if ``model``'s pass may be unrolled at all: on the CPU, in a dtype with fused
    ops (``paged.kernels.cpu``), with the fused ops on and ``PAGED_UNROLLED`` not ``0``; else None."""
    if not (UNROLLED and cpu_kernels.FUSED_OPS):
        return None
    weight = model.get_input_embeddings().weight
    if weight.device.type != "cpu" or weight.dtype not in (torch.float32, torch.bfloat16):
        return None
    return cpu_kernels.load()
