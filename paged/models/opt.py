"""OPT, the model of the PagedAttention paper, over a pluggable attention.

Differences from the LLaMA family: learned absolute positions looked up at
``position + 2`` (OPT reserves the first two rows, a fairseq legacy),
LayerNorm, a ReLU MLP ``fc2(relu(fc1(x)))``, biases everywhere, full
multi-head attention (H_kv = H). ``do_layer_norm_before=True`` (125m, 1.3b,
...) is pre-norm with a final LayerNorm; ``False`` (350m) is post-norm with
none. When ``word_embed_proj_dim`` differs from ``hidden_size`` (350m),
``project_in`` widens the embeddings and ``project_out`` narrows the last
hidden state back before the tied LM head.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from paged.models.attention import Attention
from paged.models.base import CausalLM
from paged.models.config import ModelConfig
from paged.models.layers import Embedding, Linear, MergedLinear
from paged.models.unrolled import UnrolledOPT, unrolled

POSITION_OFFSET = 2  # OPT's learned position table starts at row 2


class OPTAttention(nn.Module):
    """Fused q/k/v projection, the pluggable attention, ``out_proj``. The scale goes to attention;
    q is not pre-scaled."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        h, d = config.num_heads, config.head_dim
        self.num_heads, self.head_dim, self.scale = h, d, d**-0.5
        self.qkv_proj = MergedLinear(config.hidden_size, (h * d, h * d, h * d), bias=config.qkv_bias)
        self.out_proj = Linear(h * d, config.hidden_size, bias=config.o_bias)

    def forward(self, layer: int, x: torch.Tensor, attention: Attention) -> torch.Tensor:
        """``[T, hidden]`` -> ``[T, hidden]``."""
        t = x.shape[0]
        q, k, v = (p.view(t, self.num_heads, self.head_dim) for p in self.qkv_proj.split(self.qkv_proj(x)))
        out = attention(layer, q, k, v, self.scale)  # [T, H, D]
        return self.out_proj(out.reshape(t, self.num_heads * self.head_dim))


class OPTDecoderLayer(nn.Module):
    """Attention and ReLU MLP, each with a residual and a LayerNorm before (pre-LN) or after (post-LN)."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.pre_norm = config.do_layer_norm_before
        affine = config.layer_norm_affine
        self.self_attn = OPTAttention(config)
        self.self_attn_layer_norm = nn.LayerNorm(config.hidden_size, elementwise_affine=affine)
        self.fc1 = Linear(config.hidden_size, config.intermediate_size, bias=config.mlp_bias)
        self.fc2 = Linear(config.intermediate_size, config.hidden_size, bias=config.mlp_bias)
        self.final_layer_norm = nn.LayerNorm(config.hidden_size, elementwise_affine=affine)

    def forward(self, layer: int, h: torch.Tensor, attention: Attention) -> torch.Tensor:  # [T, hidden]
        x = self.self_attn_layer_norm(h) if self.pre_norm else h
        h = h + self.self_attn(layer, x, attention)
        if not self.pre_norm:
            h = self.self_attn_layer_norm(h)
        x = self.final_layer_norm(h) if self.pre_norm else h
        h = h + self.fc2(F.relu(self.fc1(x)))
        if not self.pre_norm:
            h = self.final_layer_norm(h)
        return h


class OPTDecoder(nn.Module):
    """Token and position embeddings, the layers, the optional final LayerNorm."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        proj = config.word_embed_proj_dim
        self.embed_tokens = Embedding(config.vocab_size, proj)
        self.embed_positions = Embedding(config.max_position_embeddings + POSITION_OFFSET, config.hidden_size)
        self.project_in = Linear(proj, config.hidden_size, bias=False) if proj != config.hidden_size else None
        self.project_out = Linear(config.hidden_size, proj, bias=False) if proj != config.hidden_size else None
        self.layers = nn.ModuleList(OPTDecoderLayer(config) for _ in range(config.num_layers))
        affine = config.layer_norm_affine
        self.final_layer_norm = (
            nn.LayerNorm(config.hidden_size, elementwise_affine=affine) if config.final_layer_norm else None
        )

    # --8<-- [start:embed]
    def forward(self, input_ids, positions, attention):  # [T], [T] -> [T, hidden]
        x = self.embed_tokens(input_ids)  # [T, word_embed_proj_dim]
        if self.project_in is not None:
            x = self.project_in(x)
        h = x + self.embed_positions(positions + POSITION_OFFSET)  # [T, hidden]
        for i, layer in enumerate(self.layers):
            h = layer(i, h, attention)
        return self.final_layer_norm(h) if self.final_layer_norm is not None else h

    # --8<-- [end:embed]


class OPTModel(nn.Module):
    """Holds the decoder, so parameter names match Hugging Face's ``model.decoder.*``."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.decoder = OPTDecoder(config)

    def forward(self, input_ids, positions, attention):
        return self.decoder(input_ids, positions, attention)


class OPTForCausalLM(CausalLM):
    """OPT causal LM; see ``CausalLM`` for the calling convention.

    ``forward`` returns ``[T, hidden]``; ``compute_logits`` applies ``project_out`` (when present)
    and the LM head, so the narrowing runs only on the rows that are sampled.

    Args:
        config: a ``ModelConfig`` with ``architecture == "opt"``.
    """

    packed_modules = {"qkv_proj": ("q_proj", "k_proj", "v_proj")}
    tp_plan = {"qkv_proj": "column", "out_proj": "row", "fc1": "column", "fc2": "row"}

    def __init__(self, config: ModelConfig):
        super().__init__()
        if config.architecture != "opt":
            raise ValueError(f"OPTForCausalLM needs an opt config, got {config.architecture!r}")
        self.config = config
        self.model = OPTModel(config)
        self.lm_head = Linear(config.word_embed_proj_dim, config.vocab_size, bias=False)
        self.tie_weights()

    def get_input_embeddings(self) -> nn.Embedding:
        """The token embedding module."""
        return self.model.decoder.embed_tokens

    def unroll(self) -> UnrolledOPT | None:
        """``OPTDecoder.forward`` as one loop of kernel calls (``paged.models.unrolled``), where the kernels
        allow it and every norm is torch's own ``nn.LayerNorm``."""
        decoder = self.model.decoder
        norms = [n for layer in decoder.layers for n in (layer.self_attn_layer_norm, layer.final_layer_norm)]
        norms += [decoder.final_layer_norm] if decoder.final_layer_norm is not None else []
        return unrolled(self, UnrolledOPT, norms, nn.LayerNorm, POSITION_OFFSET)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:  # [T', hidden] -> [T', V]
        project_out = self.model.decoder.project_out
        return self.lm_head(project_out(hidden) if project_out is not None else hidden)
