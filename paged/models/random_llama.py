"""Random LLaMA checkpoints, written in-process with ``transformers`` (no downloads).

The benchmarks, the notebooks and the tests need real checkpoints (a
``config.json`` and safetensors that ``load_model`` reads like any other)
without fetching one. This module is the one place that shapes them:

* ``llama_shape(**overrides)``: the keyword arguments of a ``transformers``
  LLaMA-family config, ``TINY_SHAPE`` unless overridden (BOS 1, EOS 2).
* ``random_llama(path, seed, **overrides)``: a seeded ``LlamaForCausalLM``
  with ``transformers``' own random initialisation, saved to ``path``.
* ``load_random_llama(dtype, **overrides)``: the same, written to a temporary
  folder and loaded with ``load_model``.

``transformers`` is imported inside the functions: it is needed to write a
checkpoint, never to load or run one.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import torch

# 2 layers, hidden 64, 4 query heads sharing 2 KV heads: the benchmarks' and notebooks' tiny model.
TINY_SHAPE = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2)
# The bundled demo model's shape (paged.demo): a stand-in of the same cost when its weights are absent.
DEMO_SHAPE = dict(vocab_size=4096, hidden_size=256, intermediate_size=688, num_hidden_layers=6,
                  num_attention_heads=8, num_key_value_heads=2)
MAX_LEN = 2048  # default context (max_position_embeddings)


def llama_shape(**overrides) -> dict:
    """Config keywords of a tiny LLaMA: ``TINY_SHAPE``, context ``MAX_LEN``, BOS 1, EOS 2, then ``overrides``."""
    return {**TINY_SHAPE, "max_position_embeddings": MAX_LEN, "bos_token_id": 1, "eos_token_id": 2, **overrides}


def quiet_transformers() -> None:
    """No warnings or progress bars from ``transformers`` while it writes a checkpoint."""
    import transformers

    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()


def random_llama(path: str | Path, seed: int = 0, **overrides) -> Path:
    """Write a LLaMA of ``llama_shape(**overrides)`` with weights drawn after ``torch.manual_seed(seed)``.

    The same seed and shape give the same weights, so a benchmark or test that
    builds its model here is repeatable. Returns ``path``.
    """
    import transformers

    quiet_transformers()
    config = transformers.LlamaConfig(**llama_shape(**overrides))
    torch.manual_seed(seed)
    transformers.LlamaForCausalLM(config).save_pretrained(path, safe_serialization=True)
    return Path(path)


def load_random_llama(dtype: torch.dtype = torch.float32, seed: int = 0, **overrides):
    """``random_llama`` written to a temporary folder and loaded with ``paged.models.load_model``."""
    from paged.models.loader import load_model

    with tempfile.TemporaryDirectory() as tmp:
        return load_model(random_llama(tmp, seed, **overrides), dtype=dtype)


def demo_shaped_llama(path: str | Path, seed: int = 0) -> tuple[Path, str]:
    """A random LLaMA of ``DEMO_SHAPE`` written to ``path``, and a line saying what it is.

    What a measurement uses when the demo model's weights are absent: its cost
    per token depends on the shape, not on the weights.
    """
    s = DEMO_SHAPE
    return random_llama(path, seed, **s), (
        f"model: random LLaMA of the demo model's shape ({s['num_hidden_layers']} layers, hidden "
        f"{s['hidden_size']}, {s['num_attention_heads']}/{s['num_key_value_heads']} heads, MLP "
        f"{s['intermediate_size']}, vocab {s['vocab_size']}), built in-process")
