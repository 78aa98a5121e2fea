"""The families added after LLaMA and OPT: Qwen3, Phi-3, Gemma 2, Gemma 3 (text), and Llama 3.1 GGUF files.

For each family a tiny random checkpoint is written by ``transformers``
(``tests/hf_models.py``, ``FLOAT32_KINDS``) and loaded by
``paged.models.load_model`` in float32, the dtype these families' transformers
code is written for (Gemma normalises in float32 whatever the model's dtype):

* logits of prompts of lengths 7, 1 and 40 packed into one forward pass equal
  transformers' per-prompt logits, toleranced (``LOGITS_FLOAT32``: same math,
  other order). The 40-token prompt outruns Gemma's window of 16 and Phi-3's
  of 48 once generation starts, so the window masks real keys;
* 20 greedy tokens per prompt are token-identical to ``generate(do_sample=False)``.

GGUF files written from those checkpoints the way llama.cpp's converter lays
them out (``tests/gguf_files.py``: per-family names, Gemma's norms stored as
``1 + w``, Llama 3.1's ``rope_freqs``) load to the folder's weights bitwise
(Gemma's norms: bitwise ``(w + 1) - 1`` in float32, what the file can hold) and
generate transformers' tokens.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from paged.models import ContiguousAttention, ModelLoadError, greedy_generate, load_model
from paged.models.attention import attention_options
from tests.gguf_files import write_gguf
from tests.hf_models import FLOAT32_KINDS, build_hf_model, save_checkpoint
from tests.tolerances import LOGITS_FLOAT32

PROMPT_LENS = (7, 1, 40)
NEW_TOKENS = 20
# GGUF files: (kind, llama.cpp architecture, config overrides the file format needs). llama.cpp scales
# Gemma's scores by the head dimension (the file has no query_pre_attn_scalar) and Gemma 3's layers
# follow its default pattern (five sliding, one global); Phi-3 GGUF without LongRoPE factors.
GGUF_CASES = {
    "llama3_rope": ("llama", {}),
    "qwen3": ("qwen3", {}),
    "phi3": ("phi3", {"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 1.0}}),
    "gemma2": ("gemma2", {"query_pre_attn_scalar": 16}),
    "gemma3": ("gemma3", {"query_pre_attn_scalar": 16, "num_hidden_layers": 6,
                          "layer_types": ["sliding_attention"] * 5 + ["full_attention"]}),
}


def _prompts(vocab: int, seed: int = 1) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(3, vocab, (n,), generator=gen).tolist() for n in PROMPT_LENS]


def _hf_greedy(hf, prompts):
    with torch.no_grad():
        return [hf.generate(torch.tensor([p]), max_new_tokens=NEW_TOKENS, do_sample=False)[0, len(p):].tolist()
                for p in prompts]


@pytest.fixture(scope="module", params=FLOAT32_KINDS)
def pair(request, tmp_path_factory):
    """(kind, transformers model in float32, our model loaded in float32)."""
    hf = build_hf_model(request.param).float()
    path = save_checkpoint(hf, tmp_path_factory.mktemp(request.param))
    loaded = load_model(path, dtype=torch.float32)
    return request.param, hf, loaded.model


def test_families_logits_equal_transformers_float32_toleranced(pair):
    """Toleranced (LOGITS_FLOAT32): one packed forward pass against transformers per prompt."""
    kind, hf, ours = pair
    prompts = _prompts(ours.config.vocab_size)
    attention = ContiguousAttention(ours.config.num_layers)
    attention.begin([0, 1, 2], [len(p) for p in prompts])
    ids = torch.tensor([t for p in prompts for t in p])
    positions = torch.cat([torch.arange(len(p)) for p in prompts])
    with torch.no_grad():
        got = ours.compute_logits(ours(ids, positions, attention))
        want = torch.cat([hf(torch.tensor([p])).logits[0] for p in prompts])
    print(f"\n[{kind}] largest |logit difference| vs transformers (float32): {(got - want).abs().max().item():.3e}")
    torch.testing.assert_close(got, want, **LOGITS_FLOAT32)


def test_families_greedy_tokens_identical_to_transformers(pair):
    """Token-identical: 20 greedy tokens for prompts of lengths 7, 1 and 40, decoded as one batch."""
    _, hf, ours = pair
    prompts = _prompts(ours.config.vocab_size, seed=2)
    assert greedy_generate(ours, prompts, NEW_TOKENS) == _hf_greedy(hf, prompts)


@pytest.mark.parametrize("kind", list(GGUF_CASES))
def test_families_gguf_weights_equal_the_folder_and_tokens_transformers(kind, tmp_path):
    """Bitwise weights (Gemma's norms: bitwise ``(w + 1) - 1``) and token-identical greedy output."""
    arch, overrides = GGUF_CASES[kind]
    hf = build_hf_model(kind, **overrides).float()
    folder = save_checkpoint(hf, tmp_path / "folder")
    path = write_gguf(tmp_path / "model.gguf", hf.state_dict(), hf.config.to_dict(), arch=arch)
    ours = load_model(path, dtype="float32")
    ref = load_model(folder, dtype="float32")
    for name in ("model_type", "num_layers", "num_kv_heads", "head_dim", "rope_theta", "rope_local_theta",
                 "sliding_window", "layer_types", "qk_norm", "query_pre_attn_scalar", "attn_logit_softcapping",
                 "final_logit_softcapping", "hidden_act", "tie_word_embeddings"):
        assert getattr(ours.config, name) == getattr(ref.config, name), name
    want = dict(ref.model.named_parameters())
    for name, p in ours.model.named_parameters():
        w = (want[name] + 1) - 1 if arch.startswith("gemma") and name.endswith("norm.weight") else want[name]
        assert torch.equal(p, w), name
    if kind == "llama3_rope":  # the bands come from the file's rope_freqs, not from a rope_scaling entry
        assert ours.config.rope_scaling["rope_type"] == "freq_factors"
    prompts = _prompts(ours.config.vocab_size, seed=2)
    assert greedy_generate(ours.model, prompts, NEW_TOKENS) == _hf_greedy(hf, prompts)


def test_attention_options_pass_a_window_only_where_it_cuts():
    """Exact: a window reaches the attention only when a query sits at a position >= the window; softcap always."""
    assert attention_options(16, 16, None) == {}
    assert attention_options(16, 17, None) == {"window": 16}
    assert attention_options(None, 100, 2.0) == {"softcap": 2.0}
    assert attention_options(16, 40, 2.0) == {"window": 16, "softcap": 2.0}


def test_families_refusals_name_the_problem(tmp_path):
    """Specific errors: Phi-3 sharded, a multimodal Gemma 3 folder, a GGUF file with LongRoPE factors."""
    folder = save_checkpoint(build_hf_model("phi3"), tmp_path / "phi3")
    with pytest.raises(ModelLoadError, match="tensor parallelism is not supported for model_type 'phi3'"):
        load_model(folder, dtype="float32", shard=lambda model, layout: {})
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "model_type": "gemma3"}))
    with pytest.raises(ModelLoadError, match="multimodal Gemma 3 folder"):
        load_model(folder)
    hf = build_hf_model("llama")
    path = write_gguf(tmp_path / "long.gguf", hf.state_dict(), hf.config.to_dict(),
                      extra_tensors={"rope_factors_short.weight": np.ones(8, np.float32)})
    with pytest.raises(ModelLoadError, match="LongRoPE factors"):
        load_model(path)


def _qwen2_config(**fields) -> dict:
    return {**build_hf_model("qwen2").config.to_dict(), "num_hidden_layers": 4, **fields}


def test_qwen_window_applies_from_max_window_layers_on_as_in_transformers():
    """Exact: a Qwen2 config with ``use_sliding_window`` and no ``layer_types`` slides on layers
    ``>= max_window_layers`` only (transformers' rule); every layer full: no window at all."""
    import transformers

    from paged.models.hf_config import parse_hf_config

    hf = _qwen2_config(use_sliding_window=True, sliding_window=8, max_window_layers=2)
    hf.pop("layer_types", None)
    ours = parse_hf_config(hf)
    theirs = transformers.Qwen2Config(**hf).layer_types
    assert [ours.window(i) is not None for i in range(4)] == [t == "sliding_attention" for t in theirs] \
        == [False, False, True, True]
    assert parse_hf_config({**hf, "max_window_layers": 4}).sliding_window is None
    assert parse_hf_config({**hf, "use_sliding_window": False}).sliding_window is None


@pytest.mark.parametrize("fields, message", [
    ({"sliding_window": -4}, "sliding_window must be >= 1"),
    ({"attn_logit_softcapping": -50.0}, "attn_logit_softcapping must be a finite number > 0"),
    ({"final_logit_softcapping": float("inf")}, "final_logit_softcapping must be a finite number > 0"),
], ids=["negative-window", "negative-softcap", "infinite-softcap"])
def test_config_refuses_a_window_below_1_and_bad_softcaps(fields, message):
    """Specific errors, raised when the config is parsed (before a weight is read)."""
    from paged.models.hf_config import parse_hf_config

    hf = {**build_hf_model("gemma2").config.to_dict(), **fields}
    with pytest.raises(ModelLoadError, match=message):
        parse_hf_config(hf)
