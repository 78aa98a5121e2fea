"""Tiny random Hugging Face checkpoints of every supported architecture, built in the test.

``build_hf_model(kind)`` makes a ``transformers`` model with a tiny config
(hidden 64, 2 layers, vocab <= 256; the LLaMA family's shape comes from
``paged.models.random_llama.llama_shape``) and random weights — biases and norm
weights included, so a wrongly placed bias or norm cannot hide behind zeros
and ones — in float64. ``save_checkpoint`` writes it with ``save_pretrained``
(safetensors) to a folder that ``paged.models.load_model`` reads. No
downloads. The step03+ tests reuse these builders to make checkpoints.

``float64_rmsnorm()`` fixes one transformers quirk for the float64 reference:
its RMSNorm casts the input to float32 (meant as an upcast of half
precision), which for a float64 model is a downcast to float32 at every
norm; inside the context it upcasts only, like ``paged.models``' RMSNorm.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import torch
import transformers

from paged.models.random_llama import llama_shape

KINDS = ("llama", "llama_tied_bias", "llama3_rope", "llama_linear_rope", "mistral", "qwen2", "opt", "opt_350m")
# The families whose transformers code computes parts in float32 whatever the model's dtype (Gemma's
# norms) or that came later: proven in float32 (tests/models/test_families.py).
FLOAT32_KINDS = ("qwen3", "phi3", "gemma2", "gemma3")

# The tiny LLaMA shape of paged.models.random_llama (hidden 64, 2 layers, 4 query / 2 KV heads, BOS 1,
# EOS 2), with a vocabulary and MLP width of its own so that no size coincides with another.
_LLAMA = llama_shape(vocab_size=160, intermediate_size=96, max_position_embeddings=128, rms_norm_eps=1e-5)


# Gemma's tiny shape: 3 layers (a global one among sliding ones), a window of 16 the prompts outrun.
_GEMMA = dict(vocab_size=184, hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
              num_key_value_heads=2, head_dim=16, max_position_embeddings=128, sliding_window=16, rms_norm_eps=1e-6,
              bos_token_id=2, eos_token_id=1, pad_token_id=0)


def hf_config(kind: str) -> transformers.PretrainedConfig:
    """The tiny ``transformers`` config of ``kind`` (one of ``KINDS``)."""
    if kind == "llama":  # grouped-query attention: 4 query heads share 2 KV heads
        return transformers.LlamaConfig(**_LLAMA)
    if kind == "llama_tied_bias":  # tied embeddings, q/k/v/o and MLP biases, full multi-head
        return transformers.LlamaConfig(
            **{**_LLAMA, "num_key_value_heads": 4}, tie_word_embeddings=True, attention_bias=True, mlp_bias=True
        )
    if kind == "llama3_rope":  # Llama 3.1 scaling; original length 32 puts the 8 frequencies in all 3 bands
        rope = dict(rope_type="llama3", rope_theta=10000.0, factor=8.0, low_freq_factor=1.0,
                    high_freq_factor=4.0, original_max_position_embeddings=32)
        return transformers.LlamaConfig(**_LLAMA, rope_scaling=rope)
    if kind == "llama_linear_rope":
        return transformers.LlamaConfig(**_LLAMA, rope_scaling=dict(rope_type="linear", rope_theta=500.0, factor=2.0))
    if kind == "mistral":  # explicit head_dim different from hidden / heads
        return transformers.MistralConfig(**{**_LLAMA, "num_attention_heads": 8}, head_dim=12, sliding_window=64)
    if kind == "qwen2":  # q/k/v biases always; 4 query heads per KV head
        return transformers.Qwen2Config(**{**_LLAMA, "num_key_value_heads": 1, "vocab_size": 200})
    if kind == "opt":  # pre-LN (125m-style), tied LM head
        return transformers.OPTConfig(
            vocab_size=256, hidden_size=64, ffn_dim=128, num_hidden_layers=2, num_attention_heads=4,
            max_position_embeddings=128, do_layer_norm_before=True, word_embed_proj_dim=64,
            pad_token_id=1, bos_token_id=2, eos_token_id=2,
        )
    if kind == "opt_350m":  # post-LN, no final LayerNorm, project_in / project_out around the layers
        return transformers.OPTConfig(
            vocab_size=256, hidden_size=64, ffn_dim=128, num_hidden_layers=2, num_attention_heads=4,
            max_position_embeddings=128, do_layer_norm_before=False, word_embed_proj_dim=32,
            pad_token_id=1, bos_token_id=2, eos_token_id=2,
        )
    if kind == "qwen3":  # per-head q/k norms; a head_dim that is not hidden / heads
        return transformers.Qwen3Config(**{**_LLAMA, "vocab_size": 176}, head_dim=24, attention_bias=False)
    if kind == "phi3":  # fused qkv / gate_up in the checkpoint, LongRoPE, a window of 48 on every layer
        rope = dict(rope_type="longrope", rope_theta=10000.0, short_factor=[1.0 + 0.1 * i for i in range(8)],
                    long_factor=[2.0 + 0.5 * i for i in range(8)], original_max_position_embeddings=64)
        return transformers.Phi3Config(**{**_LLAMA, "vocab_size": 168}, rope_parameters=rope, sliding_window=48,
                                       original_max_position_embeddings=64, pad_token_id=0)
    if kind == "gemma2":  # alternating window-16 / global layers, small caps so that soft-capping bites
        return transformers.Gemma2Config(**_GEMMA, query_pre_attn_scalar=24, attn_logit_softcapping=2.0,
                                         final_logit_softcapping=3.0)
    if kind == "gemma3":  # q/k norms, a global layer between sliding ones, two RoPE bases
        return transformers.Gemma3TextConfig(**_GEMMA, query_pre_attn_scalar=20,
                                             layer_types=["sliding_attention", "full_attention", "sliding_attention"],
                                             rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1e6},
                                                              "sliding_attention": {"rope_type": "default",
                                                                                    "rope_theta": 1e4}})
    raise ValueError(f"unknown kind {kind!r}; one of {KINDS + FLOAT32_KINDS}")


def build_hf_model(kind: str, seed: int = 0, **overrides) -> transformers.PreTrainedModel:
    """A float64 ``transformers`` causal LM of ``kind`` with random weights (sdpa attention, eval mode);
    ``overrides`` change config fields (e.g. ``vocab_size=157``)."""
    config = hf_config(kind)
    for key, value in overrides.items():
        setattr(config, key, value)
    config._attn_implementation = "eager" if kind == "gemma2" else "sdpa"  # SDPA has no soft-capping
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config).to(torch.float64).eval()
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name and name.endswith("weight"):
                p.copy_(1 + 0.2 * torch.randn(p.shape, generator=gen, dtype=p.dtype))
            else:  # weights and biases alike
                p.copy_(0.15 * torch.randn(p.shape, generator=gen, dtype=p.dtype))
    model.generation_config.eos_token_id = None  # generate exactly max_new_tokens unless a test sets one
    model.generation_config.pad_token_id = 0
    return model


def save_checkpoint(model: transformers.PreTrainedModel, path: Path, max_shard_size: str | None = None) -> Path:
    """``save_pretrained`` as safetensors (sharded with an index when ``max_shard_size`` is small)."""
    kwargs = {"max_shard_size": max_shard_size} if max_shard_size else {}
    model.save_pretrained(path, safe_serialization=True, **kwargs)
    return Path(path)


def write_tokenizer(path: Path, vocab_size: int) -> None:
    """A word-level ``tokenizer.json`` with words ``w0 .. w{V-1}`` split on whitespace."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({f"w{i}": i for i in range(vocab_size)}, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(Path(path) / "tokenizer.json"))


def _rmsnorm_upcast_only(self, hidden_states):
    dtype = hidden_states.dtype
    x = hidden_states.to(torch.promote_types(dtype, torch.float32))
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
    return self.weight * x.to(dtype)


@contextlib.contextmanager
def float64_rmsnorm():
    """Within the block, transformers' Llama/Mistral/Qwen2 RMSNorm keeps float64 inputs in float64."""
    from transformers.models.llama import modeling_llama
    from transformers.models.mistral import modeling_mistral
    from transformers.models.qwen2 import modeling_qwen2

    classes = [modeling_llama.LlamaRMSNorm, modeling_mistral.MistralRMSNorm, modeling_qwen2.Qwen2RMSNorm]
    saved = [c.forward for c in classes]
    try:
        for c in classes:
            c.forward = _rmsnorm_upcast_only
        yield
    finally:
        for c, f in zip(classes, saved):
            c.forward = f
