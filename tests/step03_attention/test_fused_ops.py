"""The serving fast paths equal the eager formulas they replace.

The fused C++ ops (``csrc/cpu/fused_ops.cpp``) each replace a chain of eager
PyTorch operations in ``paged.models.layers``; the runner's greedy fast path
replaces the sampler's float32 argmax; prefill attention runs SDPA's fused
kernel instead of its math path. Levels of equality:

* RoPE (``rotary_``), the residual add of ``add_rms_norm``, ``argmax_rows`` and
  the greedy fast path: bitwise (``torch.equal``) — the same products and sums,
  rounded at the same places.
* RMSNorm (LLaMA's and Gemma's): toleranced — only the order of the float32 sum of squares differs,
  which moves the normalised value by float32 rounding (~1e-7 relative); after
  the rounding to the storage type that is at most one bfloat16 ulp
  (``FUSED_BFLOAT16``), ``FLOAT32`` in float32. Gemma's also bitwise on inputs whose sum of
  squares is exact in any order (small integers).
* SiLU-and-mul: toleranced likewise — exp is a polynomial (AVX-512) or
  ``std::exp``, not PyTorch's, within an ulp of float32 before the rounding.
* A whole LLaMA forward pass, fused vs eager, in float32: ``FUSED_MODEL_FLOAT32``.
* oneDNN-packed linear weights (``prepack_linears``): a bfloat16 forward pass
  bitwise equal to the plain GEMMs'.
* Prefill attention: the fused SDPA kernel vs the oracle, toleranced
  (``FLOAT32``; ``PREFILL_BFLOAT16``: it rounds probabilities to bfloat16).

The extension is built once per session; a failed build fails these tests.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from paged.kernels import cpu
from paged.models import ContiguousAttention, load_model
from paged.models import layers
from paged.models.gemma import GemmaRMSNorm
from paged.models.layers import RMSNorm, RotaryEmbedding, prepack_linears, silu_and_mul, silu_and_mul_eager
from paged.step02_block_table.kv_cache import zeros_on_demand
from paged.step03_attention.backends import prefill_attention
from paged.step03_attention.runner import greedy_tokens
from paged.sampling.sampler import sample
from paged.sampling.sampling_params import SamplingParams
from tests import tolerances
from tests.hf_models import build_hf_model, save_checkpoint
from tests.oracle import contiguous_attention

DTYPES = [torch.float32, torch.bfloat16]
CLOSE = {torch.float32: tolerances.FLOAT32, torch.bfloat16: tolerances.FUSED_BFLOAT16}


@pytest.fixture(scope="module", autouse=True)
def ext():
    """The compiled extension (built once; a failed build fails the tests)."""
    return cpu.load(strict=True)


def _randn(*shape, dtype, seed=0, scale=1.0):
    return (torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * scale).to(dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("width", [64, 512, 1000])
def test_fused_rms_norm_equals_eager(dtype, width):
    """Residual sum bitwise; the normalised output toleranced (the sum of squares' order)."""
    norm = RMSNorm(width, 1e-5).to(dtype)
    with torch.no_grad():
        norm.weight.copy_(_randn(width, dtype=dtype, seed=1))
    x, residual = _randn(37, width, dtype=dtype, scale=3.0), _randn(37, width, dtype=dtype, seed=2)
    with torch.inference_mode():
        plain = norm(x)
        normed, summed = norm.add_and_norm(x, residual)
    torch.testing.assert_close(plain, norm.eager(x), **CLOSE[dtype])
    assert torch.equal(summed, x + residual)
    torch.testing.assert_close(normed, norm.eager(x + residual), **CLOSE[dtype])


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("width", [64, 640, 1000])
def test_fused_gemma_rms_norm_equals_eager(dtype, width):
    """Gemma's norm (scale ``1 + w`` in float32, one rounding at the end), alone, after a residual, and per
    head on a strided [T, H, D] view. Toleranced on random inputs (the sum of squares' order); bitwise
    where that sum is exact in any order (small integers), which pins every rounding after it."""
    norm = GemmaRMSNorm(width, 1e-6).to(dtype)
    with torch.no_grad():
        norm.weight.copy_(_randn(width, dtype=dtype, seed=1))
    x, residual = _randn(37, width, dtype=dtype, scale=3.0), _randn(37, width, dtype=dtype, seed=2)
    exact = torch.randint(-8, 9, (37, width), generator=torch.Generator().manual_seed(3)).to(dtype)
    heads = _randn(5, 3, width + 16, dtype=dtype, seed=4)[:, :, :width]  # rows of a wider tensor
    with torch.inference_mode():
        plain, summed = norm(x), norm.norm_and_add(x, residual)
        exact_plain, exact_summed = norm(exact), norm.norm_and_add(exact, residual)
        per_head = norm(heads)
    torch.testing.assert_close(plain, norm.eager(x), **CLOSE[dtype])
    torch.testing.assert_close(summed, residual + norm.eager(x), **CLOSE[dtype])
    torch.testing.assert_close(per_head, norm.eager(heads), **CLOSE[dtype])
    assert torch.equal(exact_plain, norm.eager(exact))
    assert torch.equal(exact_summed, residual + norm.eager(exact))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_fused_rotary_equals_eager_bitwise(dtype):
    """In place on a strided view of a fused q|k|v output, the same roundings as the eager formula."""
    config = build_hf_model("llama").config
    from paged.models.hf_config import parse_hf_config

    rotary = RotaryEmbedding(parse_hf_config(config.to_dict()))
    rotary.reset_table(dtype)
    heads, d = 6, rotary.cos.shape[1] * 2
    qkv = _randn(9, heads + 2, d, dtype=dtype, scale=4.0)
    x = qkv[:, :heads]  # rows of (heads + 2) * D: not contiguous
    positions = torch.tensor([0, 5, 3, 1, 40, 2, 2, 7, 11])
    want = rotary.eager(x, positions)
    with torch.inference_mode():
        got = rotary(x, positions)
    assert got.data_ptr() == x.data_ptr(), "the fused path rotates in place"
    assert torch.equal(got, want)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_fused_silu_and_mul_equals_eager(dtype):
    """Toleranced: another exp, then the same roundings (one bfloat16 ulp at most)."""
    x = _randn(21, 2 * 600, dtype=dtype, scale=4.0)  # 600: a 16-wide body and a tail
    with torch.inference_mode():
        got = silu_and_mul(x)
    torch.testing.assert_close(got, silu_and_mul_eager(x), **CLOSE[dtype])


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_fused_argmax_equals_torch_bitwise(dtype):
    """First index of the maximum on ties, and a NaN wins, exactly as torch.argmax."""
    logits = _randn(7, 3001, dtype=dtype)  # 3001: 16-wide vector passes and a scalar tail
    logits[1, [10, 20]] = 50.0  # a tie: the first index
    logits[2, [7, 3000]] = float("nan")  # NaN: the first NaN
    logits[3, :] = 0.0  # all equal, -0 first: equal to +0
    logits[3, 0] = -0.0
    logits[4, 3000] = float("inf")  # the maximum in the tail
    logits[5, 3000] = float("nan")  # a NaN only in the tail
    got = cpu.load().argmax_rows(logits)
    assert torch.equal(got, logits.argmax(dim=1))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_greedy_fast_path_equals_sampler_bitwise(dtype):
    """The runner's greedy tokens are the sampler's greedy tokens, bit for bit."""
    logits = _randn(64, 5000, dtype=dtype, scale=2.0)
    logits[5, [3, 9]] = 30.0
    params = [SamplingParams(temperature=0.0)] * 64
    want = [r.token_id for r in sample(logits, params, [torch.Generator()] * 64)]
    with torch.inference_mode():
        assert greedy_tokens(logits).tolist() == want


def test_fused_ops_reject_bad_input_with_a_specific_error():
    ops = cpu.load()
    with pytest.raises(TypeError, match="x must be float32 or bfloat16"):
        ops.silu_and_mul(torch.zeros(2, 4, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"x must be \[T, 2 \* I\]"):
        ops.silu_and_mul(torch.zeros(2, 5))
    with pytest.raises(ValueError, match=r"weight must be \[N\] = \[8\]"):
        ops.add_rms_norm(torch.zeros(2, 8), None, torch.ones(4), 1e-5)
    with pytest.raises(ValueError, match="residual must match x"):
        ops.add_rms_norm(torch.zeros(2, 8), torch.zeros(3, 8), torch.ones(8), 1e-5)
    with pytest.raises(ValueError, match=r"weight must be \[N\] = \[8\]"):
        ops.gemma_rms_norm(torch.zeros(2, 8), None, torch.ones(4), 1e-6)
    with pytest.raises(ValueError, match="residual must match x"):
        ops.gemma_rms_norm(torch.zeros(2, 8), torch.zeros(2, 4), torch.ones(8), 1e-6)
    table = torch.zeros(4, 2)
    with pytest.raises(ValueError, match=r"positions\[1\] = 4 is outside the table's \[0, 4\)"):
        ops.rotary_(torch.zeros(2, 1, 4), torch.tensor([0, 4]), table, table)


def test_fused_ops_only_serve_inference_mode():
    """Training keeps the eager path (the fused ops have no backward), and so does float64."""
    x = torch.zeros(2, 8)
    assert cpu.fused_ops(x) is None
    with torch.inference_mode():
        assert cpu.fused_ops(x) is cpu.load()
        assert cpu.fused_ops(x.double()) is None


@pytest.fixture(scope="module")
def llama_float32(tmp_path_factory):
    path = save_checkpoint(build_hf_model("llama"), tmp_path_factory.mktemp("llama"))
    return load_model(path, dtype=torch.float32).model


def _logits(model, prompts):
    attention = ContiguousAttention(model.config.num_layers)
    attention.begin(list(range(len(prompts))), [len(p) for p in prompts])
    ids = torch.tensor([t for p in prompts for t in p])
    positions = torch.cat([torch.arange(len(p)) for p in prompts])
    with torch.inference_mode():
        return model.compute_logits(model(ids, positions, attention))


def test_fused_llama_forward_equals_eager_float32(llama_float32, monkeypatch):
    """Toleranced (FUSED_MODEL_FLOAT32): float32 reorderings through every layer."""
    gen = torch.Generator().manual_seed(3)
    prompts = [torch.randint(3, llama_float32.config.vocab_size, (n,), generator=gen).tolist() for n in (9, 1, 30)]
    fused = _logits(llama_float32, prompts)
    monkeypatch.setattr(cpu, "FUSED_OPS", False)  # what PAGED_FUSED_OPS=0 at import sets
    with torch.inference_mode():
        assert cpu.fused_ops(torch.zeros(2, 4)) is None  # so the layers below run their eager formulas
    eager = _logits(llama_float32, prompts)
    torch.testing.assert_close(fused, eager, **tolerances.FUSED_MODEL_FLOAT32)


def test_paged_fused_ops_0_in_the_environment_turns_the_fused_ops_off():
    """Exact (the printed flag): the switch as a user sets it, in the environment before ``paged`` is imported
    (read once, there)."""
    code = "import paged.kernels.cpu as c; print(c.FUSED_OPS)"
    for value, expected in (("0", "False"), ("1", "True")):
        env = {**os.environ, "PAGED_FUSED_OPS": value}
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
        assert out.stdout.strip() == expected


def test_prepacked_linears_equal_plain_gemms_bitwise(tmp_path, monkeypatch):
    """Every linear of a bfloat16 LLaMA packed once: the same logits, bit for bit."""
    model = load_model(save_checkpoint(build_hf_model("llama"), tmp_path), dtype=torch.bfloat16).model
    prompts = [[5, 9, 11, 2, 7], [3], list(range(3, 40))]
    plain = _logits(model, prompts)
    monkeypatch.setenv("PAGED_PREPACK_WEIGHTS", "1")
    # LM head, qkv, o, gate_up, down; on a CPU whose oneDNN cannot pack bfloat16 (AVX2 only) none
    # is packed and the plain GEMMs run: the same assertion on the logits then covers that fallback
    packable = layers._can_prepack()
    assert prepack_linears(model) == (1 + 4 * model.config.num_layers if packable else 0)
    assert torch.equal(_logits(model, prompts), plain)


def test_prepacking_falls_back_to_plain_gemms_where_the_cpu_cannot_pack(tmp_path, monkeypatch):
    """A CPU that cannot pack: nothing is packed, nothing fails, the logits are the same bit for bit."""
    model = load_model(save_checkpoint(build_hf_model("llama"), tmp_path), dtype=torch.bfloat16).model
    plain = _logits(model, [[5, 9, 11]])
    monkeypatch.setenv("PAGED_PREPACK_WEIGHTS", "1")
    monkeypatch.setattr(layers, "_can_prepack", lambda: False)
    assert prepack_linears(model) == 0
    assert torch.equal(_logits(model, [[5, 9, 11]]), plain)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("heads", [(8, 8), (8, 2)], ids=["mha", "gqa"])
def test_prefill_attention_equals_contiguous_toleranced(dtype, heads):
    """SDPA's fused CPU kernel over one prompt vs the float32 oracle over the same inputs."""
    h, h_kv = heads
    q, k, v = (_randn(45, n, 32, dtype=dtype, seed=s) for s, n in ((4, h), (5, h_kv), (6, h_kv)))
    want = contiguous_attention(q.float(), k.float(), v.float(), 32**-0.5)
    got = prefill_attention(q, k, v, 32**-0.5)
    tol = tolerances.FLOAT32 if dtype == torch.float32 else tolerances.PREFILL_BFLOAT16
    torch.testing.assert_close(got.float(), want, **tol)


def _resident_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 2**20


def test_kv_pool_reads_zero_and_takes_memory_only_when_written():
    """A 512 MiB CPU pool adds (far) less than 64 MiB of resident memory until it is written."""
    before = _resident_mib()
    pool = zeros_on_demand((2**18, 8, 128), torch.bfloat16, "cpu")  # 512 MiB
    assert _resident_mib() - before < 64
    assert pool[:: 2**12].abs().sum().item() == 0.0
    pool[:1024] = 1.0
    assert pool[:1024].float().mean().item() == 1.0 and pool[1024:1030].abs().sum().item() == 0.0
