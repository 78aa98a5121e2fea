"""``quantization="gguf"``: a GGUF model whose linears multiply by the file's blocks.

The files are tiny Hugging Face LLaMAs written as GGUF by ``tests.gguf_files.write_gguf``
(llama.cpp's names, its query/key row order). The reference is the same file loaded dense
in float32 with each linear multiplying the int8-rounded activations
(``quantize_activations``) by the dequantized weight: what the kernel computes, in another
order. Toleranced: logits within ``1e-4`` of the largest logit. The two differ only by float32
summation order (relative 1e-6), unless a difference moves an activation across a rounding
boundary of its int8 grid, one step of one activation; a row of q or k in the wrong order, a
missing part of a fused layer or a misread block moves logits by a sizable fraction of their
range (the test checks the plain dense model is farther than the bound, so it can tell).
"""

from __future__ import annotations

import gguf
import pytest
import torch
import torch.nn.functional as F

from paged import LLM, SamplingParams
from paged.kernels import cpu
from paged.models import layers, load_model, quantized
from paged.models.contiguous import ContiguousAttention
from paged.models.quantized import DENSE_ROWS, QuantizedLinear, quantize_activations
from tests.gguf_files import gguf_name, write_gguf
from tests.hf_models import build_hf_model, save_checkpoint

T = gguf.GGMLQuantizationType
PROMPT = [1, 17, 99, 3, 42, 120, 7, 64, 5, 88, 31]


def _gguf(tmp_path, qtype, kind="llama"):
    hf = build_hf_model(kind)
    return write_gguf(tmp_path / f"{kind}-{qtype.name}.gguf", hf.state_dict(), hf.config.to_dict(), qtype=qtype)


def _logits(model, ids):
    attention = ContiguousAttention(model.config.num_layers)
    attention.begin([0], [len(ids)])
    with torch.inference_mode():
        hidden = model(torch.tensor(ids), torch.arange(len(ids)), attention)
        return model.compute_logits(hidden).float()


def _rounding_activations(model, like):
    """Make the linears of ``model`` that are quantized in the model ``like`` multiply the int8-rounded
    activations, as the kernel does."""
    names = {n for n, m in like.named_modules() if isinstance(m, QuantizedLinear)}
    for name, module in model.named_modules():
        if name in names:
            module.forward = lambda x, m=module: F.linear(quantize_activations(x), m.weight.float()).to(x.dtype)
    return model


@pytest.mark.parametrize("qtype", [T.Q4_1, T.Q4_0, T.Q5_0, T.Q8_0])
def test_quantized_model_equals_dense_with_rounded_activations(qtype, tmp_path):
    path = _gguf(tmp_path, qtype)
    quant = load_model(path, dtype="float32", quantization="gguf")
    linears = [m for m in quant.model.modules() if isinstance(m, QuantizedLinear)]
    assert len(linears) == 4 * quant.config.num_layers + 1 and {m.format for m in linears} == {qtype.name}
    # no dense weight was made for them: no layer holds a dense layer, the model no dense linear
    assert all(m.dense is None for m in linears)
    assert not any(isinstance(m, layers.Linear) for m in quant.model.modules())
    traits = quant.model.prepare_for_serving(batch_invariant=True)  # 11 rows would go to the dense layers otherwise
    # the layers multiply in the lanes layout where the AVX2 loops are built
    lanes = cpu.load().quant_avx2_compiled()
    assert traits.lane_linears == (len(linears) if lanes else 0)
    assert all((m.lane_blocks is not None) == lanes for m in linears)
    assert all((m.blocks is None) == lanes for m in linears)  # the lanes replace the row layout: one copy
    want = _logits(_rounding_activations(load_model(path, dtype="float32").model, quant.model), PROMPT)
    got = _logits(quant.model, PROMPT)
    bound = 1e-4 * want.abs().max()
    assert (got - want).abs().max() <= bound
    plain = _logits(load_model(path, dtype="float32").model, PROMPT)
    assert (plain - want).abs().max() > bound  # the rounded activations are what the test compares


def test_a_file_cut_inside_a_replaced_linear_is_refused(tmp_path):
    """Exact: with ``quantization="gguf"`` the conversion no longer dequantizes the replaced linears; a file cut
    inside their data (here the LM head's) is still refused, with its name and 'truncated' (the reader checks
    every tensor's bytes against the file's size before anything is read)."""
    from paged.models import ModelLoadError

    data = _gguf(tmp_path, T.Q4_1).read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[: len(data) - 64])  # inside the last tensor's data
    with pytest.raises(ModelLoadError, match=r"cut\.gguf: .*truncated"):
        load_model(cut, dtype="float32", quantization="gguf")


def test_tied_head_reads_the_embedding_blocks(tmp_path, monkeypatch):
    """A tied LM head is quantized from token_embd's blocks; the embedding lookup stays dense. Toleranced
    logits (the module's bound); exact: with the mode off its dense layer is the embedding's weight itself,
    no blocks dequantized for it."""
    path = _gguf(tmp_path, T.Q8_0, kind="llama_tied_bias")  # biases: those linears stay dense
    quant = load_model(path, dtype="float32", quantization="gguf")
    quant.model.prepare_for_serving(batch_invariant=True)
    assert isinstance(quant.model.lm_head, QuantizedLinear)
    assert type(quant.model.model.embed_tokens).__name__ == "Embedding"
    assert not isinstance(quant.model.model.layers[0].self_attn.qkv_proj, QuantizedLinear)  # it has a bias
    want = _logits(_rounding_activations(load_model(path, dtype="float32").model, quant.model), PROMPT)
    got = _logits(quant.model, PROMPT)
    assert (got - want).abs().max() <= 1e-4 * want.abs().max()
    dequantized = []
    real = quantized.dequantize_blocks
    monkeypatch.setattr(quantized, "dequantize_blocks", lambda *a: dequantized.append(a[2:]) or real(*a))
    quant.model.prepare_for_serving(batch_invariant=False)  # its dense layer for many rows: the embedding's weight
    assert quant.model.lm_head.dense.weight is quant.model.model.embed_tokens.weight
    others = [m for m in quant.model.modules() if isinstance(m, QuantizedLinear) and m is not quant.model.lm_head]
    assert sorted(dequantized) == sorted((m.out_features, m.in_features) for m in others)


def test_many_rows_take_the_dense_layers(tmp_path):
    """Bitwise: with the mode off, more than ``DENSE_ROWS`` rows give the dense model's logits; fewer, the
    kernel's (not those)."""
    path = _gguf(tmp_path, T.Q4_1)
    quant, dense = load_model(path, dtype="float32", quantization="gguf"), load_model(path, dtype="float32")
    quant.model.prepare_for_serving(batch_invariant=False)
    dense.model.prepare_for_serving(batch_invariant=False)
    assert torch.equal(_logits(quant.model, PROMPT), _logits(dense.model, PROMPT))
    short = PROMPT[:DENSE_ROWS]
    assert not torch.equal(_logits(quant.model, short), _logits(dense.model, short))
    quant.model.prepare_for_serving(batch_invariant=True)
    kernel = _logits(quant.model, PROMPT)
    assert not torch.equal(kernel, _logits(dense.model, PROMPT))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_quantized_layer_holds_a_dense_layer_only_where_it_runs(tmp_path, dtype):
    """Exact. As loaded no quantized layer holds a dense layer. With the mode off, a layer whose dense GEMM is
    the faster for many rows makes one from its blocks: bitwise the dense load's weights, so a prompt's
    logits are bitwise the dense model's. Batch-invariant serving runs only the kernel: every layer lets its
    dense layer go (nothing references its weights) and nothing is laid out for it (the traits count no
    oneDNN-packed or pair-order copy); the mode off again makes it again."""
    import gc
    import weakref

    path = _gguf(tmp_path, T.Q4_1)
    quant = load_model(path, dtype=dtype, quantization="gguf").model
    linears = {name: m for name, m in quant.named_modules() if isinstance(m, QuantizedLinear)}
    assert all(m.dense is None and m.dense_rows is None for m in linears.values())
    dense = load_model(path, dtype=dtype).model
    dense.prepare_for_serving(batch_invariant=False)
    many_rows_dense = quantized.dense_is_faster_for_many_rows(getattr(torch, dtype))

    def mode_off_is_the_dense_model():
        quant.prepare_for_serving(batch_invariant=False)
        for name, m in linears.items():
            assert m.dense_rows == (DENSE_ROWS if many_rows_dense else None)
            assert (m.dense is None if not many_rows_dense
                    else torch.equal(m.dense.weight, dense.get_submodule(name).weight))
        if many_rows_dense:
            assert torch.equal(_logits(quant, PROMPT), _logits(dense, PROMPT))

    mode_off_is_the_dense_model()
    held = [weakref.ref(m.dense.weight) for m in linears.values() if m.dense is not None]
    assert len(held) == (len(linears) if many_rows_dense else 0)
    traits = quant.prepare_for_serving(batch_invariant=True)
    gc.collect()
    assert all(m.dense is None and m.dense_rows is None for m in linears.values())
    assert not any(ref() is not None for ref in held)
    assert traits.packed_linears == traits.pair_order_linears == 0  # every linear here is quantized
    assert all((m.blocks is None) == (m.lane_blocks is not None) for m in linears.values())  # one layout each
    mode_off_is_the_dense_model()  # where the lanes replaced the blocks, the dense layers come from the lanes


def test_huge_page_parts_lie_apart_in_one_allocation_asked_for_huge_pages(monkeypatch):
    """Exact: the parts have their sizes, each starts on a 4 KiB boundary after the one before, the first on a
    2 MiB one, all in one allocation, and that range (from the first part to the end of the last page) is
    what ``madvise`` is asked to back with huge pages; written, each part reads back as written."""
    asked = []
    monkeypatch.setattr(layers, "_advise_huge_pages", lambda address, length: asked.append((address, length)))
    sizes = [5000, 1, 4096, 300_000]
    parts = layers.huge_page_parts(sizes)
    assert [p.numel() for p in parts] == sizes and all(p.dtype == torch.uint8 for p in parts)
    starts = [p.data_ptr() for p in parts]
    assert starts[0] % layers.HUGE_PAGE == 0 and all(s % 4096 == 0 for s in starts)
    assert [b - a for a, b in zip(starts, starts[1:])] == [8192, 4096, 4096]
    assert len({p.untyped_storage().data_ptr() for p in parts}) == 1
    assert asked == [(starts[0], 8192 + 4096 + 4096 + 303_104)]
    for i, p in enumerate(parts):
        p.fill_(i + 1)
    assert all(bool((p == i + 1).all()) for i, p in enumerate(parts))


def test_serving_hands_the_freed_memory_back_after_the_layers_let_go(tmp_path, monkeypatch):
    """Exact: ``prepare_for_serving`` calls ``return_freed_memory`` when no quantized layer holds a dense layer
    any more, before any layer is laid out in lanes (so the lay-outs reuse what loading freed instead of
    adding to it: the peak), and again after (the row layouts they replaced); the calls themselves run here."""
    import paged.models.base as base

    quant = load_model(_gguf(tmp_path, T.Q4_1), dtype="float32", quantization="gguf").model
    linears = [m for m in quant.modules() if isinstance(m, QuantizedLinear)]
    seen = []
    monkeypatch.setattr(base, "return_freed_memory", lambda: seen.append(
        (sum(m.dense is not None for m in linears), sum(m.lane_blocks is not None for m in linears)))
        or layers.return_freed_memory())
    traits = quant.prepare_for_serving(batch_invariant=True)
    assert seen == [(0, 0), (0, traits.lane_linears)]


@pytest.mark.parametrize("has_bf16_gemm", [True, False])
def test_bfloat16_batches_stay_on_the_kernel_where_torch_has_no_fast_bfloat16_gemm(tmp_path, monkeypatch,
                                                                                    has_bf16_gemm):
    """Exact: in bfloat16 a layer hands batches of more than ``DENSE_ROWS`` rows to its dense layer only where
    this CPU's oneDNN has a bfloat16 GEMM (``cpu_has_bf16_gemm``; else torch's is 4-5x slower than the
    kernel); float32 always does. Bitwise: a bfloat16 prompt on the kernel gives what the kernel-only
    (batch-invariant) model gives, and on the dense layers what the dense model gives."""
    import paged.models.quantized as quantized_module

    monkeypatch.setattr(quantized_module, "cpu_has_bf16_gemm", lambda: has_bf16_gemm)
    path = _gguf(tmp_path, T.Q4_1)
    quant = load_model(path, dtype="bfloat16", quantization="gguf").model
    linears = [m for m in quant.modules() if isinstance(m, QuantizedLinear)]
    quant.prepare_for_serving(batch_invariant=False)
    assert all(m.dense_rows == (DENSE_ROWS if has_bf16_gemm else None) for m in linears)
    mode_off = _logits(quant, PROMPT)
    dense_model = load_model(path, dtype="bfloat16").model
    dense_model.prepare_for_serving(batch_invariant=False)
    dense = _logits(dense_model, PROMPT)
    quant.prepare_for_serving(batch_invariant=True)
    kernel_only = _logits(quant, PROMPT)
    assert torch.equal(mode_off, dense if has_bf16_gemm else kernel_only)
    assert not torch.equal(dense, kernel_only)
    quant.prepare_for_serving(batch_invariant=False)
    assert all(m.dense_rows == (DENSE_ROWS if has_bf16_gemm else None) for m in linears)
    f32 = load_model(path, dtype="float32", quantization="gguf").model
    f32.prepare_for_serving(batch_invariant=False)
    assert all(m.dense_rows == DENSE_ROWS for m in f32.modules() if isinstance(m, QuantizedLinear))


def test_llm_serves_a_quantized_model(tmp_path):
    """End to end through the engine. Batch-invariant: a prompt's greedy tokens alone and beside another
    prompt are the same (bitwise: every row takes the kernel, whose rows do not depend on the batch), with
    no layer padding a lone row. Otherwise prompts take the dense layers and every request still gets its
    tokens."""
    path = _gguf(tmp_path, T.Q4_1)
    sp = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    llm = LLM(model=str(path), dtype="bfloat16", quantization="gguf", batch_invariant=True, num_blocks=64)
    assert llm.model.model.prepare_for_serving(batch_invariant=True).padded_linears == 0
    alone = llm.generate([PROMPT], sp, use_tqdm=False)[0].outputs[0].token_ids
    beside = llm.generate([PROMPT[:4], PROMPT, PROMPT[3:]], sp, use_tqdm=False)[1].outputs[0].token_ids
    assert alone == beside and len(alone) == 6
    fast = LLM(model=str(path), dtype="bfloat16", quantization="gguf", batch_invariant=False, num_blocks=64)
    assert all(len(o.outputs[0].token_ids) == 6 for o in fast.generate([PROMPT, PROMPT[:5]], sp, use_tqdm=False))


def test_bad_choices_are_refused_before_loading(tmp_path):
    """Specific errors: an unknown quantization, a folder, another device, float16, tensor parallelism."""
    path = _gguf(tmp_path, T.Q4_1)
    with pytest.raises(ValueError, match="quantization must be None or one of 'gguf', got 'awq'"):
        load_model(path, quantization="awq")
    folder = save_checkpoint(build_hf_model("llama"), tmp_path / "folder")
    with pytest.raises(ValueError, match="is not a .gguf file"):
        load_model(folder, quantization="gguf")
    with pytest.raises(ValueError, match="CPU only"):
        load_model(path, device="cuda", quantization="gguf")
    with pytest.raises(ValueError, match="float32 or bfloat16, got dtype='float16'"):
        load_model(path, dtype="float16", quantization="gguf")
    with pytest.raises(ValueError, match="cannot be combined with tensor_parallel_size=2"):
        LLM(model=str(path), quantization="gguf", tensor_parallel_size=2)


def test_prepare_for_serving_makes_every_row_independent_of_the_batch_in_batch_invariant_mode(tmp_path,
                                                                                                monkeypatch):
    """Exact: batch-invariant, a model whose every linear is quantized runs only kernels (their rows do not
    depend on the row count) and pads no row; otherwise its layers keep their dense path. A dense model's
    linears multiply a lone row as two in batch-invariant mode, and only then; or, with the fixed-order
    kernel (``PAGED_FIXED_ORDER_LINEAR=1``, the default on a CPU without a bfloat16 GEMM), run it and pad
    nothing. The choice is the model's own (``CausalLM.prepare_for_serving``)."""
    monkeypatch.setenv("PAGED_FIXED_ORDER_LINEAR", "0")
    path = _gguf(tmp_path, T.Q4_1)
    quant = load_model(path, dtype="float32", quantization="gguf").model
    linears = [m for m in quant.modules() if isinstance(m, QuantizedLinear)]
    assert quant.prepare_for_serving(batch_invariant=True).padded_linears == 0
    assert all(m.dense_rows is None for m in linears)
    quant.prepare_for_serving(batch_invariant=False)
    assert all(m.dense_rows == DENSE_ROWS for m in linears)
    # the dense fallback multiplies as a dense linear does (here: forced off, the stock GEMM), never padded
    assert not any(m.dense.fixed_order or m.dense.pad_one_row for m in linears)
    monkeypatch.delenv("PAGED_FIXED_ORDER_LINEAR")
    default = layers.use_fixed_order_linears(torch.zeros(1, 8), batch_invariant=False)
    assert quant.prepare_for_serving(batch_invariant=False).fixed_order_linears == 0  # counts no fallback
    assert all(m.dense.fixed_order == default and not m.dense.pad_one_row for m in linears)
    assert all(m.dense.fixed_order_rows == layers.FLOAT32_FIXED_ORDER_ROWS for m in linears)
    monkeypatch.setenv("PAGED_FIXED_ORDER_LINEAR", "0")
    dense = load_model(path, dtype="float32").model
    n = sum(isinstance(m, torch.nn.Linear) for m in dense.modules())
    assert dense.prepare_for_serving(batch_invariant=True).padded_linears == n > 0
    assert dense.prepare_for_serving(batch_invariant=False).padded_linears == 0
    assert not any(m.pad_one_row for m in dense.modules() if isinstance(m, torch.nn.Linear))
    monkeypatch.setenv("PAGED_FIXED_ORDER_LINEAR", "1")
    traits = dense.prepare_for_serving(batch_invariant=True)
    assert (traits.fixed_order_linears, traits.padded_linears) == (n, 0)
    assert all(m.fixed_order_rows is None for m in dense.modules() if isinstance(m, torch.nn.Linear))
    # with the mode off the default rule decides (on a CPU without a bfloat16 GEMM, the kernel for float32
    # calls of up to FLOAT32_FIXED_ORDER_ROWS rows), and no row is padded
    default = layers.use_fixed_order_linears(torch.zeros(1, 8), batch_invariant=False)
    assert dense.prepare_for_serving(batch_invariant=False).fixed_order_linears == (n if default else 0)
    assert not any(m.pad_one_row for m in dense.modules() if isinstance(m, torch.nn.Linear))
    assert all(m.fixed_order_rows == layers.FLOAT32_FIXED_ORDER_ROWS
               for m in dense.modules() if isinstance(m, torch.nn.Linear) and m.fixed_order)


def test_kquant_layers_equal_dense_with_rounded_activations(tmp_path):
    """Toleranced (float32 sums in another order, 1e-4 of the largest output): a Qwen3 whose linears are
    Q4_K (down projections Q6_K) blocks, random bytes a file could hold, runs those layers on the kernel;
    every one of them, fed in a forward pass, gives the dense load's product of the int8-rounded
    activations. Compared layer by layer on the kernel's own inputs: rounding activations to int8 is a
    step function, so an ulp of difference upstream can move an activation a whole step, which end to end
    moved the first token's logits by 1 % of their range on an AVX2-only CPU."""
    import numpy as np

    from paged.models.kquants import K_FORMATS

    hf = build_hf_model("qwen3", hidden_size=256, intermediate_size=512, head_dim=64)
    rng = np.random.default_rng(0)
    raw = {}
    for name, p in hf.state_dict().items():
        if p.dim() == 2 and name != "model.embed_tokens.weight":
            kind = T.Q6_K if "down_proj" in name else T.Q4_K
            blocks = rng.integers(0, 256, (p.shape[0], p.shape[1] // 256, K_FORMATS[int(kind)][1]), dtype=np.uint8)
            at = (208,) if kind == T.Q6_K else (0, 2)  # the float16 factors: small, finite
            for a in at:
                blocks[..., a:a + 2] = rng.uniform(0.001, 0.01, blocks.shape[:2]).astype(np.float16).view(
                    np.uint8).reshape(*blocks.shape[:2], 2)
            raw[gguf_name(name, "qwen3")] = (kind, blocks.reshape(p.shape[0], -1))
    path = write_gguf(tmp_path / "k.gguf", hf.state_dict(), hf.config.to_dict(), arch="qwen3", raw_tensors=raw)
    quant = load_model(path, dtype="float32", quantization="gguf")
    formats = {m.format for m in quant.model.modules() if isinstance(m, QuantizedLinear)}
    traits = quant.model.prepare_for_serving(batch_invariant=True)
    assert formats == {"Q4_K", "Q6_K"} and traits.padded_linears == 0
    # in the lanes layout where the AVX2 loops are built, so the comparison below checks that layout
    assert traits.lane_linears == (4 * quant.config.num_layers + 1) * cpu.load().quant_avx2_compiled()
    dense = dict(load_model(path, dtype="float32").model.named_modules())
    seen = []
    hooks = [m.register_forward_hook(lambda m, args, out, name=name: seen.append((name, args[0], out)))
             for name, m in quant.model.named_modules() if isinstance(m, QuantizedLinear)]
    _logits(quant.model, PROMPT)
    for hook in hooks:
        hook.remove()
    assert len(seen) == 4 * quant.config.num_layers + 1
    rounding_matters = False
    for name, x, got in seen:
        weight = dense[name].weight.detach().float()
        want = F.linear(quantize_activations(x), weight)
        bound = 1e-4 * want.abs().max()
        assert (got - want).abs().max() <= bound, name
        rounding_matters |= bool((F.linear(x, weight) - want).abs().max() > bound)
    assert rounding_matters  # the rounded activations are what the test compares
