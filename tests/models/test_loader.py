"""The checkpoint loader: what it reads, bitwise, and how it refuses a folder it cannot load.

Weights are checked bitwise (``torch.equal``): loading is a copy (plus a cast
for other dtypes), no arithmetic. Every broken folder must raise
``ModelLoadError`` naming the file and the problem, before any tensor data is
read (the headers are enough), so nothing half-loads.
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

import paged.models.loader as loader_module
from paged.models import (
    ContiguousAttention,
    LlamaForCausalLM,
    ModelLoadError,
    OPTForCausalLM,
    load_model,
)
from paged.models.hf_config import parse_hf_config
from paged.models.layers import Embedding
from tests.hf_models import build_hf_model, save_checkpoint, write_tokenizer


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    hf = build_hf_model("llama")
    return hf, save_checkpoint(hf, tmp_path_factory.mktemp("llama"))


def _copy(src, tmp_path):
    dst = tmp_path / "ckpt"
    shutil.copytree(src, dst)
    return dst


def _hf_weights_equal_ours(hf, ours, dtype=torch.float64):
    """Every transformers tensor equals the rows of our parameter it was loaded into, bitwise."""
    hf_params = dict(hf.state_dict())
    params = dict(ours.named_parameters())
    checked = 0
    for name, parts in ours.checkpoint_layout().items():
        for ck_name, row, rows in parts:
            assert torch.equal(params[name][row : row + rows], hf_params[ck_name].to(dtype)), ck_name
            checked += 1
    return checked


@pytest.mark.parametrize("kind", ["llama", "qwen2", "opt_350m", "llama_tied_bias"])
def test_loader_weights_equal_checkpoint_bitwise(kind, tmp_path):
    """Bitwise: fused q/k/v and gate/up rows hold the separate checkpoint tensors, in order."""
    hf = build_hf_model(kind)
    ours = load_model(save_checkpoint(hf, tmp_path), dtype=torch.float64).model
    assert _hf_weights_equal_ours(hf, ours) >= len(list(ours.parameters()))
    if isinstance(ours, LlamaForCausalLM):
        c = ours.config
        qkv = ours.model.layers[0].self_attn.qkv_proj
        assert qkv.output_sizes == (c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim, c.num_kv_heads * c.head_dim)
        assert (qkv.bias is not None) == (kind in ("qwen2", "llama_tied_bias"))


def test_loader_sharded_checkpoint_equals_single_file_bitwise(llama_dir, tmp_path):
    """Bitwise: a checkpoint split into shards with model.safetensors.index.json loads the same weights."""
    hf, single = llama_dir
    sharded = save_checkpoint(hf, tmp_path / "sharded", max_shard_size="40KB")
    assert (sharded / "model.safetensors.index.json").is_file()
    assert len(list(sharded.glob("*.safetensors"))) > 2
    a = load_model(single, dtype=torch.float64).model.state_dict()
    b = load_model(sharded, dtype=torch.float64).model.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("kind", ["llama_tied_bias", "opt"])
def test_loader_tied_embeddings_share_one_tensor(kind, tmp_path):
    hf = build_hf_model(kind)
    path = save_checkpoint(hf, tmp_path)
    model = load_model(path, dtype=torch.float64).model
    assert model.lm_head.weight is model.get_input_embeddings().weight
    assert torch.equal(model.lm_head.weight, hf.get_output_embeddings().weight)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16", "float64", torch.bfloat16, "auto"])
def test_loader_dtypes_cast_bitwise(llama_dir, dtype):
    """Bitwise: each weight is the checkpoint's float64 tensor cast once; 'auto' takes config.json's dtype."""
    hf, path = llama_dir
    loaded = load_model(path, dtype=dtype)
    want = {"auto": torch.float64, torch.bfloat16: torch.bfloat16}.get(dtype) or getattr(torch, dtype)
    model = loaded.model
    assert {p.dtype for p in model.parameters()} == {want} and model.model.rotary_emb.cos.dtype == want
    assert _hf_weights_equal_ours(hf, model, want) > 0
    with torch.no_grad():
        attention = ContiguousAttention(loaded.config.num_layers)
        attention.begin([0], [4])
        logits = model.compute_logits(model(torch.tensor([3, 4, 5, 6]), torch.arange(4), attention))
    assert logits.dtype == want and torch.isfinite(logits).all()


def test_loader_rejects_unknown_dtype(llama_dir):
    with pytest.raises(ValueError, match="int8.*supported: float32"):
        load_model(llama_dir[1], dtype="int8")


def test_loader_reads_tokenizer_and_generation_config_eos(llama_dir, tmp_path):
    path = _copy(llama_dir[1], tmp_path)
    loaded = load_model(path)
    assert loaded.tokenizer is None and loaded.eos_token_ids == [2]  # generation_config.json from save_pretrained
    write_tokenizer(path, 160)
    gen = json.loads((path / "generation_config.json").read_text())
    (path / "generation_config.json").write_text(json.dumps({**gen, "eos_token_id": [2, 7]}))
    loaded = load_model(path)
    assert loaded.tokenizer.encode("w5 w17 w2").ids == [5, 17, 2]
    assert loaded.eos_token_ids == [2, 7]
    (path / "generation_config.json").unlink()
    assert load_model(path).eos_token_ids == [2]  # config.json's eos_token_id


def test_loader_accepts_opt_checkpoint_saved_without_model_prefix(tmp_path):
    """facebook/opt-* checkpoints name tensors ``decoder.*`` (saved from OPTModel)."""
    hf = build_hf_model("opt")
    path = save_checkpoint(hf, tmp_path)
    tensors = load_file(path / "model.safetensors")
    save_file({k.removeprefix("model."): v for k, v in tensors.items()}, path / "model.safetensors")
    model = load_model(path, dtype=torch.float64).model
    assert isinstance(model, OPTForCausalLM) and _hf_weights_equal_ours(hf, model) > 0


def test_loader_config_dialects_agree():
    """transformers 4 (top-level rope_theta / rope_scaling, torch_dtype) and 5 (rope_parameters, dtype)."""
    base = dict(model_type="llama", vocab_size=8, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                intermediate_size=32, max_position_embeddings=64)
    old = parse_hf_config({**base, "torch_dtype": "bfloat16", "rope_theta": 5e5,
                           "rope_scaling": {"type": "linear", "factor": 4.0}})
    new = parse_hf_config({**base, "dtype": "bfloat16",
                           "rope_parameters": {"rope_type": "linear", "rope_theta": 5e5, "factor": 4.0}})
    assert old == new and old.rope_scaling == {"rope_type": "linear", "factor": 4.0}
    assert old.torch_dtype == torch.bfloat16 and old.rope_theta == 5e5 and old.head_dim == 8


# ---- folders it must refuse: (how to break a good folder, what the message must say) ----


def _set_config(path, **changes):
    cfg = json.loads((path / "config.json").read_text())
    cfg.update(changes)
    (path / "config.json").write_text(json.dumps(cfg))


def _rewrite_tensors(path, edit):
    tensors = load_file(path / "model.safetensors")
    edit(tensors)
    save_file(tensors, path / "model.safetensors")


BROKEN = {
    "missing_config": (lambda p: (p / "config.json").unlink(), r"config\.json: missing"),
    "bad_json": (lambda p: (p / "config.json").write_text("{"), r"config\.json: cannot read JSON"),
    "unknown_model_type": (
        lambda p: _set_config(p, model_type="gpt2"),
        r"config\.json: model_type 'gpt2' is not supported; supported: gemma2, gemma3_text, llama, mistral, opt, phi3, "
        r"qwen2, qwen3",
    ),
    "unsupported_rope": (
        lambda p: _set_config(p, rope_parameters={"rope_type": "yarn", "factor": 2.0, "rope_theta": 1e4}),
        r"config\.json: rope type 'yarn' is not supported",
    ),
    "no_weights": (lambda p: (p / "model.safetensors").unlink(), r"no \*\.safetensors file"),
    "missing_tensor": (
        lambda p: _rewrite_tensors(p, lambda t: t.pop("model.layers.1.self_attn.k_proj.weight")),
        r"missing tensors \['model\.layers\.1\.self_attn\.k_proj\.weight'\]",
    ),
    "unexpected_tensor": (
        lambda p: _rewrite_tensors(p, lambda t: t.update({"model.layers.0.extra.weight": torch.zeros(2)})),
        r"model\.safetensors: unexpected tensors \['model\.layers\.0\.extra\.weight'\]",
    ),
    "shape_mismatch": (
        lambda p: _set_config(p, intermediate_size=100),
        r"model\.safetensors: tensor 'model\.layers\.0\.mlp\.gate_proj\.weight' has shape \[96, 64\], "
        r"the config needs \[100, 64\]",
    ),
    "corrupt_safetensors": (
        lambda p: (p / "model.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{notjson"),
        r"model\.safetensors: not a readable safetensors file",
    ),
}


@pytest.mark.parametrize("case", list(BROKEN))
def test_loader_refuses_broken_folder_before_reading_weights(case, llama_dir, tmp_path, monkeypatch):
    """ModelLoadError naming the file and the problem; no tensor data was read (nothing half-loads)."""
    path = _copy(llama_dir[1], tmp_path)
    breaker, message = BROKEN[case]
    breaker(path)
    reads = []
    real_safe_open = loader_module.safe_open

    class CountingSafeOpen:
        def __init__(self, *args, **kwargs):
            self.inner = real_safe_open(*args, **kwargs)

        def __enter__(self):
            st = self.inner.__enter__()
            real_get = st.get_tensor
            return type("Handle", (), {"keys": st.keys, "get_slice": st.get_slice,
                                       "get_tensor": lambda _, n: reads.append(n) or real_get(n)})()

        def __exit__(self, *exc):
            return self.inner.__exit__(*exc)

    monkeypatch.setattr(loader_module, "safe_open", CountingSafeOpen)
    with pytest.raises(ModelLoadError, match=message):
        load_model(path)
    assert reads == []


def test_loader_refuses_index_naming_a_missing_shard(llama_dir, tmp_path):
    path = save_checkpoint(llama_dir[0], tmp_path / "sharded", max_shard_size="40KB")
    shard = sorted(path.glob("model-*.safetensors"))[1]
    shard.unlink()
    with pytest.raises(ModelLoadError, match=rf"{shard.name}: missing, but model\.safetensors\.index\.json lists it"):
        load_model(path)


def test_loader_refuses_a_path_that_is_not_a_folder(tmp_path):
    with pytest.raises(ModelLoadError, match="not a directory"):
        load_model(tmp_path / "nope")


def test_loader_computes_nothing_on_the_meta_device(llama_dir):
    """Exact: loading a checkpoint in a fresh interpreter imports neither ``torch._dynamo`` nor sympy.

    The model is built on the meta device and every weight then comes from the checkpoint, so
    nothing is drawn or computed there. The first meta ``normal_`` (``nn.Embedding``'s own
    initialisation) or ``arange`` (a RoPE table) imports ``torch._dynamo``, about a second of every
    start-up, and the first ``empty_like`` of a meta tensor (``Module.to_empty``) imports sympy.
    """
    code = ("import sys, torch\nfrom paged.models import load_model\n"
            f"load_model({str(llama_dir[1])!r})\nprint('torch._dynamo' in sys.modules, 'sympy' in sys.modules)")
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, check=True,
                          env={**os.environ, "PYTHONPATH": str(root)})
    assert done.stdout.split()[-2:] == ["False", "False"]


def test_embedding_on_a_real_device_draws_as_nn_embedding():
    """Bitwise: off the meta device, ``Embedding`` draws the weight ``nn.Embedding`` draws from the same seed."""
    torch.manual_seed(0)
    ours = Embedding(50, 8).weight
    torch.manual_seed(0)
    assert torch.equal(ours, torch.nn.Embedding(50, 8).weight)
    assert ours.std() > 0.5  # drawn from N(0, 1), not left empty
