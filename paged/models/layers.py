"""Building blocks shared by the model definitions: fused linears, RMSNorm, RoPE.

``Embedding`` is ``nn.Embedding`` that draws no random weights on the meta device.
``Linear`` is ``nn.Linear`` that multiplies by a packed copy of its weight once
it has one (``prepack_linears``). ``MergedLinear`` is one ``Linear`` that computes several projections in one
GEMM (q|k|v, gate|up) and records the size of each part, so the loader can
fill each part from its own checkpoint tensor and a tensor-parallel step can
shard each part column-wise. ``RotaryEmbedding`` precomputes cos/sin for every
position once; a forward pass only indexes the table with ``positions``.

Serving on a CPU (``torch.inference_mode()``, float32 or bfloat16), RMSNorm
with its residual add, RoPE and SiLU-and-mul run as fused C++ ops
(``paged.kernels.cpu.fused_ops``): one pass over each row instead of a chain
of eager operations, each with its own allocation. The eager formulas below
are their specification (``tests/step03_attention/test_fused_ops.py``) and the path of
every other case (training, float64, CUDA, no compiler). ``prepack_linears``
gives a served bfloat16 model's ``Linear`` layers their weights in oneDNN's
blocked layout, once, instead of at every GEMM; each layer's own ``forward``
then multiplies by that copy. On a CPU without bfloat16 GEMM instructions
(``use_fixed_order_linears``) layers multiply by ``csrc/cpu/fixed_order_linear.cpp``
instead, whose sums have one order for any row count: batch-invariant mode's linear
there, and in bfloat16 the faster one in either mode (in float32 with the mode off,
up to ``FLOAT32_FIXED_ORDER_ROWS`` rows, where it is the faster one). On a CPU with
bfloat16 dot products but no AMX (AVX512_BF16, ``use_pair_order``) bfloat16 layers multiply by
``csrc/cpu/pair_order_linear.cpp``, another order written down, in either mode: there
it is as fast as oneDNN's GEMM at many rows and faster at few.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import math
import os
import sys
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from paged import _openmp
from paged.kernels.cpu import cpu_flags, fused_ops
from paged.kernels.cpu import load as load_cpu_kernels
from paged.models.config import ModelConfig

logger = logging.getLogger("paged")

# Whether idle OpenMP threads spin (the user's OMP_WAIT_POLICY=active) or sleep (paged's default):
# paged/_openmp.py. Waking a sleeping thread costs tens of microseconds, more than a small layer's
# one-row call gains from it; a spinning one answers at once, and then every layer of a decode step
# gains from two (measured: docs/benchmarks.md).
THREADS_SPIN = _openmp.threads_spin(os.environ)
# The work (bytes of weight) from which a fixed-order linear call takes a second thread; speed only,
# the bits are the same.
SECOND_THREAD_BYTES = 256 << 10 if THREADS_SPIN else 2 << 20


class Embedding(nn.Embedding):
    """``nn.Embedding`` whose weight is drawn at random only where it has memory.

    The loader builds every model on the meta device and then overwrites each
    weight from the checkpoint, so drawing them is wasted there, and on the meta
    device it is also slow: the first ``normal_`` of a meta tensor imports
    ``torch._dynamo`` (about 1 s). On a real device the weight is drawn as
    ``nn.Embedding`` draws it (``paged.demo.train`` trains from that draw).
    """

    def reset_parameters(self) -> None:
        if not self.weight.is_meta:
            super().reset_parameters()


def gemm(layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x @ layer.weight^T (+ bias)``, the one GEMM of every linear layer: ``[T, in] -> [T, out]``.

    With ``layer.packed_weight`` (set by ``prepack_linears`` when serving starts) it multiplies by that
    oneDNN-packed copy: the same products, bit for bit, without reordering the weight at every call.
    With ``layer.pad_one_row`` (set by ``CausalLM.prepare_for_serving`` in batch-invariant mode) a lone
    row is multiplied as two: a GEMM of one row takes another kernel than one of two or more, whose
    float32 sums can round to other bits (seen on AVX2 and AVX-512 CPUs alike, on SmolLM2's down
    projection), while from two rows up a row's bits do not depend on the row count.
    With ``layer.fixed_order`` (where ``use_fixed_order_linears`` says so) it
    multiplies by ``fixed_order_linear`` instead: one summation order written down for any row count,
    no padding needed; with ``layer.fixed_order_rows`` set (a float32 layer, the mode off), only calls of
    up to that many rows do, larger ones take the stock GEMM, the faster there. With ``layer.pair_weight``
    too (a bfloat16 layer on a CPU with AVX512_BF16, ``pack_pair_order_linears``) the fixed order is
    ``pair_order_linear``'s, by that copy of the weight.
    """
    most = getattr(layer, "fixed_order_rows", None)
    if getattr(layer, "fixed_order", False) and (most is None or x.shape[0] <= most):
        pairs = getattr(layer, "pair_weight", None)
        if pairs is not None:  # the pair order, by the weight laid out for it (pack_pair_order_linears)
            return load_cpu_kernels().pair_order_linear(x, pairs, layer.weight.shape[0], bias, SECOND_THREAD_BYTES)
        return load_cpu_kernels().fixed_order_linear(x, layer.weight, bias, SECOND_THREAD_BYTES)
    if x.shape[0] == 1 and getattr(layer, "pad_one_row", False):
        return product(layer, x.repeat(2, 1), bias)[:1]
    return product(layer, x, bias)


def product(layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """The GEMM kernel's call itself: by the packed weight when there is one, else ``F.linear``."""
    packed = getattr(layer, "packed_weight", None)
    if packed is not None:
        return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")
    return F.linear(x, layer.weight, bias)


class Linear(nn.Linear):
    """``nn.Linear`` whose product is ``gemm``: by its packed weight once serving starts, a lone row as
    two in batch-invariant mode. Inputs are 2-D ``[T, in]``, as the models pass."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True):
        super().__init__(in_features, out_features, bias=bias)
        self.packed_weight: torch.Tensor | None = None  # not a parameter: the plain weight stays the one saved
        self.pad_one_row = False
        self.fixed_order = False
        self.fixed_order_rows: int | None = None  # with fixed_order: the most rows it takes (None: any count)
        self.pair_weight: torch.Tensor | None = None  # with fixed_order: the weight laid out for the pair order

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [T, in] -> [T, out]
        return gemm(self, x, self.bias)

    def kernel_call(self) -> Callable[[torch.Tensor], torch.Tensor] | None:
        """The one call ``forward`` makes for every ``x``, bound now, where ``gemm``'s choice does not depend
        on ``x``'s row count: the pair order or the fixed order at any row count. None otherwise (the stock
        GEMM, a lone row padded, the fixed order up to some rows). Read by the unrolled pass
        (``paged.models.unrolled``) after ``prepare_for_serving`` made the choices."""
        kernels = load_cpu_kernels()
        if not self.fixed_order or self.fixed_order_rows is not None or kernels is None:
            return None
        n, bias = self.weight.shape[0], self.bias
        if self.pair_weight is not None:
            pairs, pair_linear = self.pair_weight, kernels.pair_order_linear
            return lambda x: pair_linear(x, pairs, n, bias, SECOND_THREAD_BYTES)
        weight, fixed_linear = self.weight, kernels.fixed_order_linear
        return lambda x: fixed_linear(x, weight, bias, SECOND_THREAD_BYTES)


class MergedLinear(Linear):
    """Several column-parallel projections of the same input stacked into one ``Linear``.

    Args:
        in_features: input width.
        output_sizes: width of each part, in output order (e.g. ``(H*D, H_kv*D, H_kv*D)``).
        bias: whether every part has a bias.
    """

    def __init__(self, in_features: int, output_sizes: tuple[int, ...], bias: bool):
        super().__init__(in_features, sum(output_sizes), bias=bias)
        self.output_sizes = tuple(output_sizes)

    def split(self, y: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """``[T, sum(output_sizes)]`` -> one ``[T, size]`` view per part."""
        return y.split(self.output_sizes, dim=-1)


class RMSNorm(nn.Module):
    """``x / sqrt(mean(x**2) + eps) * weight`` over the last dim.

    Half-precision inputs are normalised in float32 (as transformers and vLLM
    do); float32 and float64 inputs are normalised in their own dtype, so a
    float64 model is float64 throughout.
    """

    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [..., N] -> [..., N]
        ops = fused_ops(x)
        if ops is not None:  # the fused op takes rows: [T, N] (or [T * H, N] for per-head norms)
            return ops.add_rms_norm(x.reshape(-1, x.shape[-1]), None, self.weight, self.eps)[0].view(x.shape)
        return self.eager(x)

    def add_and_norm(self, x: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(norm(x + residual), x + residual)``: a pre-norm block's residual add and the next norm."""
        ops = fused_ops(x)
        if ops is not None:
            return ops.add_rms_norm(x, residual, self.weight, self.eps)
        residual = x + residual
        return self.eager(residual), residual

    def eager(self, x: torch.Tensor) -> torch.Tensor:
        """The formula, one PyTorch operation at a time (what the fused op is tested against)."""
        dtype = x.dtype
        x = x.to(torch.promote_types(dtype, torch.float32))
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def rope_inverse_frequencies(config: ModelConfig, local: bool = False) -> torch.Tensor:  # [D/2] float32
    """Frequency of each rotated pair, ``theta ** (-2i / D)``, with the config's scaling applied.

    Computed in float32, like the tables these checkpoints were trained and
    served with (transformers, vLLM); a float64 model casts the finished table.
    ``local``: the sliding-window layers' table (Gemma 3: base ``rope_local_theta``, no scaling).
    Scalings: ``linear`` divides every frequency by ``factor``; ``llama3`` (Llama 3.1)
    keeps wavelengths shorter than ``original / high_freq_factor``, divides those
    longer than ``original / low_freq_factor`` by ``factor`` and interpolates the
    band in between; ``longrope`` (Phi-3) multiplies the wavelengths by its short
    factors; ``freq_factors`` (a GGUF file's ``rope_freqs``, llama.cpp's form of
    Llama 3.1's bands) divides each frequency by its factor.
    """
    d = config.head_dim
    theta = config.rope_local_theta if local and config.rope_local_theta else config.rope_theta
    exponents = torch.arange(0, d, 2, dtype=torch.float32) / d
    scaling = None if local else config.rope_scaling
    if scaling is not None and scaling["rope_type"] == "longrope":
        return 1.0 / (torch.tensor(scaling["short_factor"], dtype=torch.float32) * theta**exponents)
    inv_freq = 1.0 / (theta**exponents)
    if scaling is None:
        return inv_freq
    if scaling["rope_type"] == "freq_factors":
        return inv_freq / torch.tensor(scaling["factors"], dtype=torch.float32)
    factor = scaling["factor"]
    if scaling["rope_type"] == "linear":
        return inv_freq / factor
    low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
    original = scaling["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv_freq
    long_wave = wavelen > original / low
    short_wave = wavelen < original / high
    scaled = torch.where(long_wave, inv_freq / factor, inv_freq)
    smooth = (original / wavelen - low) / (high - low)  # 0 at the long edge, 1 at the short edge
    blended = (1 - smooth) * scaled / factor + smooth * scaled
    return torch.where(~long_wave & ~short_wave, blended, scaled)


class RotaryEmbedding(nn.Module):
    """Rotary position embedding with a cos/sin table for every position, built once.

    The table is a non-persistent buffer: it follows ``.to(device/dtype)`` but
    is not part of a checkpoint; ``reset_table()`` rebuilds it (after the
    loader materialises a model built on the meta device). LongRoPE scales
    cos and sin by its ``attention_factor``, as transformers does.

    Args:
        config: the model's config.
        local: the table of the sliding-window layers (``rope_inverse_frequencies``).
    """

    def __init__(self, config: ModelConfig, local: bool = False):
        super().__init__()
        self.config, self.local = config, local
        self.register_buffer("cos", torch.empty(0), persistent=False)
        self.register_buffer("sin", torch.empty(0), persistent=False)
        self.reset_table()

    def reset_table(self, dtype: torch.dtype | None = None) -> None:
        """(Re)compute ``cos``/``sin`` ``[max_position_embeddings, D/2]`` in float32, stored in ``dtype``."""
        device, dtype = self.cos.device, dtype or self.cos.dtype
        shape = (self.config.max_position_embeddings, self.config.head_dim // 2)
        if device.type == "meta":  # a skeleton: no values to compute (and a meta arange imports torch._dynamo)
            self.cos = torch.empty(shape, device=device, dtype=dtype)
            self.sin = torch.empty(shape, device=device, dtype=dtype)
            return
        inv_freq = rope_inverse_frequencies(self.config, self.local).to(device)  # [D/2]
        pos = torch.arange(self.config.max_position_embeddings, device=device, dtype=torch.float32)
        angles = pos[:, None] * inv_freq[None, :]  # [P, D/2]
        cos, sin = angles.cos(), angles.sin()
        scaling = None if self.local else self.config.rope_scaling
        if scaling is not None and scaling["rope_type"] == "longrope":
            cos, sin = cos * scaling["attention_factor"], sin * scaling["attention_factor"]
        self.cos, self.sin = cos.to(dtype), sin.to(dtype)

    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Rotate the two halves of each head: pair ``(x[i], x[i + D/2])`` turns by ``pos * inv_freq[i]``.

        Args:
            x: ``[T, heads, D]`` queries or keys.
            positions: ``[T]`` position of each token in its own sequence.

        Returns:
            ``[T, heads, D]``, same dtype as ``x``: ``x`` itself, rotated in
            place, on the fused CPU path; a new tensor otherwise.
        """
        ops = fused_ops(x)
        if ops is not None and x.stride(-1) == 1:
            ops.rotary_(x, positions, self.cos, self.sin)
            return x
        return self.eager(x, positions)

    def eager(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """The rotation, one PyTorch operation at a time (a new tensor; the fused op's specification)."""
        cos = self.cos[positions].unsqueeze(1)  # [T, 1, D/2]
        sin = self.sin[positions].unsqueeze(1)
        x1, x2 = x.chunk(2, dim=-1)  # [T, heads, D/2] each
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:  # [T, 2I] -> [T, I]
    """SwiGLU's ``silu(gate) * up`` for ``x = gate | up`` (one GEMM's output)."""
    ops = fused_ops(x)
    if ops is not None and x.stride(-1) == 1:
        return ops.silu_and_mul(x)
    return silu_and_mul_eager(x)


def silu_and_mul_eager(x: torch.Tensor) -> torch.Tensor:
    """``silu_and_mul`` one PyTorch operation at a time (the fused op's specification)."""
    gate, up = x.chunk(2, dim=-1)
    return F.silu(gate) * up


def gelu_and_mul(x: torch.Tensor) -> torch.Tensor:  # [T, 2I] -> [T, I]
    """GeGLU's ``gelu_tanh(gate) * up`` for ``x = gate | up`` (Gemma's MLP; transformers' ``gelu_pytorch_tanh``)."""
    gate, up = x.chunk(2, dim=-1)
    return F.gelu(gate, approximate="tanh") * up


PREPACK_MAX_BYTES = 2 * 2**30  # packed copies of at most this many weight bytes by default
PREPACK_BATCH_HINT = 64  # the row count oneDNN picks the blocked layout for (any count runs)


def prepack_linears(model: nn.Module) -> int:
    """Give every bfloat16 CPU ``Linear`` of ``model`` a oneDNN-packed weight; returns how many.

    A plain bfloat16 GEMM reorders its weight into oneDNN's blocked layout at
    every call; a packed copy is reordered once (measured 8-25 % faster GEMMs
    at decode batch sizes on an AMD Zen 4, bitwise the same results). The
    plain weight stays (the loader, tied embeddings and tensor parallelism
    read it), so packing doubles the linears' weight memory: it happens by
    default only up to ``PREPACK_MAX_BYTES`` of weights;
    ``PAGED_PREPACK_WEIGHTS=1`` / ``0`` forces it on / off. Called when the
    weights are final (``CausalLM.prepare_for_serving``); only inference should
    run afterwards.
    """
    linears = [m for m in model.modules() if isinstance(m, Linear) and not m.fixed_order
               and m.weight.device.type == "cpu" and m.weight.dtype == torch.bfloat16]
    if not linears or not second_copy_allowed(_weight_bytes(linears)) or not _can_prepack():
        return 0
    for module in linears:
        with torch.no_grad():
            module.packed_weight = torch.ops.mkldnn._reorder_linear_weight(module.weight.detach(), PREPACK_BATCH_HINT)
    return len(linears)


def second_copy_allowed(nbytes: int) -> bool:
    """Whether layers may keep a second, laid-out copy of ``nbytes`` of their weights beside the plain
    ones (oneDNN's packing, the pair order, the quantized lanes): ``PAGED_PREPACK_WEIGHTS=1`` / ``0``
    says yes / no; by default, up to ``PREPACK_MAX_BYTES``."""
    setting = os.environ.get("PAGED_PREPACK_WEIGHTS", "auto")
    return setting == "1" or (setting != "0" and nbytes <= PREPACK_MAX_BYTES)


def return_freed_memory() -> None:
    """Hand the memory freed so far back to the system, where the C library can (glibc's ``malloc_trim``).

    Loading frees what it no longer needs (the converted checkpoint's copies, the conversion's float32
    tensors; a quantized layer's dense weights, ``QuantizedLinear.use_kernel_only``), but the allocator
    keeps most of those pages for later allocations, and the process's resident memory stays as high
    as if it held them: Gemma 3 270M with ``--quantization gguf`` held 1.35 GiB after a one-stream run,
    trimmed 1.18-1.19 (``python -m paged.bench engine``, docs/benchmarks.md). Elsewhere (macOS, musl)
    nothing is done."""
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return
    trim(0)


HUGE_PAGE = 2 << 20  # bytes of an x86-64 huge page
MADV_HUGEPAGE = 14  # Linux's madvise advice: back this range with huge pages (transparent huge pages)


def huge_page_parts(sizes: list[int]) -> list[torch.Tensor]:
    """Uint8 tensors of ``sizes`` bytes, each starting on a 4 KiB boundary, in one allocation aligned to
    ``HUGE_PAGE`` that Linux is asked to back with 2 MiB pages (``madvise(MADV_HUGEPAGE)``: transparent
    huge pages, where they are ``always`` or ``madvise``). Untouched until written, so the pages are
    huge from their first write; elsewhere (THP ``never``, not Linux) they are ordinary pages.

    For weights a decode step streams once each. On 4 KiB pages one stream's speed varied from process
    to process with where they lay; on huge pages it stays at the fast end (SmolLM2 ``--quantization
    gguf``, its lanes moved within one process: 98-111 tokens/s before the move, 115-119 after, and
    in a process where they were fast already no change: docs/benchmarks.md)."""
    padded = [-(-size // 4096) * 4096 for size in sizes]
    arena = torch.empty(sum(padded) + HUGE_PAGE, dtype=torch.uint8)  # malloc'd, not yet touched
    start = -arena.data_ptr() % HUGE_PAGE
    _advise_huge_pages(arena.data_ptr() + start, sum(padded))
    parts, at = [], start
    for size, room in zip(sizes, padded):
        parts.append(arena[at:at + size])
        at += room
    return parts


def _advise_huge_pages(address: int, length: int) -> bool:
    """``madvise(address, length, MADV_HUGEPAGE)``; False where it cannot be asked or is refused."""
    if length <= 0 or not sys.platform.startswith("linux"):
        return False
    try:
        madvise = ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, AttributeError):
        return False
    madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    return madvise(address, length, MADV_HUGEPAGE) == 0


def _weight_bytes(linears: list[nn.Module]) -> int:
    return sum(m.weight.numel() * m.weight.element_size() for m in linears)


FIXED_ORDER_DTYPES = (torch.float32, torch.bfloat16)
# With the mode off, a float32 layer takes the fixed-order kernel for calls of up to this many rows and
# MKL's GEMM above: on an AVX2 CPU the kernel is 2.4-2.8x faster at 1-8 rows, 1.2x at 64, about even at
# 128 (0.95-1.04x in two runs) and 0.8-0.95x at 256-1024 (``python -m paged.bench linear_kernel --dtype
# float32``, docs/benchmarks.md).
FLOAT32_FIXED_ORDER_ROWS = 128


def use_fixed_order_linears(weight: torch.Tensor, batch_invariant: bool = True) -> bool:
    """Whether a CPU linear with this weight multiplies by ``fixed_order_linear``
    (``csrc/cpu/fixed_order_linear.cpp``) rather than by the stock GEMM (in batch-invariant mode, with
    a lone row padded).

    By default where the kernel's AVX2 loop is built, in either mode: for float32 weights, and for
    bfloat16 ones on a CPU whose oneDNN has no bfloat16 GEMM (an AVX2-only CPU). There the stock
    bfloat16 GEMM runs at about 20 GFLOP/s at any row count (a padded lone row costs two), and the
    kernel is 3-3.5x faster at every row count. In float32 the kernel reads a decode step's weights
    2.5-4x faster than MKL's GEMM of a padded lone row, on an AVX2 CPU and on an AVX-512 one alike,
    and MKL's is the faster from 256 rows (``python -m paged.bench linear_kernel``;
    docs/benchmarks.md, "Batch invariance: the cost"): in batch-invariant mode the kernel takes every
    call (one order for any row count is the mode's point), with the mode off only calls of up to
    ``FLOAT32_FIXED_ORDER_ROWS`` rows (``fixed_order_rows``, set by ``CausalLM.prepare_for_serving``).
    On a CPU with AVX512_BF16 and no AMX, bfloat16 weights take it in either mode, in the pair order
    (``use_pair_order``). ``PAGED_FIXED_ORDER_LINEAR=1`` forces
    it on in batch-invariant mode for float32 and bfloat16 CPU weights (where the kernels are
    built); ``0`` forces it off in both modes."""
    if weight.device.type != "cpu" or weight.dtype not in FIXED_ORDER_DTYPES:
        return False
    setting = os.environ.get("PAGED_FIXED_ORDER_LINEAR", "auto")
    if setting == "0":
        return False
    kernels = load_cpu_kernels()
    if setting == "1" and batch_invariant:
        return kernels is not None
    if use_pair_order(weight):
        return True
    if weight.dtype == torch.bfloat16 and cpu_has_bf16_gemm():
        return False
    return kernels is not None and kernels.fixed_order_avx2_compiled()


def use_pair_order(weight: torch.Tensor) -> bool:
    """Whether a fixed-order linear with this weight can multiply in the pair order
    (``csrc/cpu/pair_order_linear.cpp``): a bfloat16 CPU weight, where the kernel's AVX512_BF16 loop is
    built. There it is as fast as oneDNN's bfloat16 GEMM from 64 rows up and 2-3x faster at 1-4 rows
    (an AMD Zen 4; ``python -m paged.bench linear_kernel``, docs/benchmarks.md), so it runs in either
    mode. Not on a CPU with AMX (``cpu_has_amx``), whose oneDNN multiplies bfloat16 on its matrix units:
    there the kernel has not been measured against it."""
    if weight.device.type != "cpu" or weight.dtype != torch.bfloat16 or cpu_has_amx():
        return False
    kernels = load_cpu_kernels()
    return kernels is not None and kernels.pair_order_compiled()


def cpu_has_amx() -> bool:
    """Whether this CPU has AMX bfloat16 tiles (Intel Xeons from Sapphire Rapids on)."""
    return "amx_bf16" in cpu_flags()


def pack_pair_order_linears(model: nn.Module) -> int:
    """Give every fixed-order linear of ``model`` that can run in the pair order (``use_pair_order``) its
    weight laid out for ``pair_order_linear`` (``pair_weight``), once; returns how many. The plain weight
    stays, as with ``prepack_linears``, under the same limit (``PREPACK_MAX_BYTES``,
    ``PAGED_PREPACK_WEIGHTS=1|0``); a layer left without the copy runs ``fixed_order_linear``, the other
    fixed order. Called by ``CausalLM.prepare_for_serving`` after it chose the fixed-order layers."""
    modules = [m for m in model.modules() if hasattr(m, "pad_one_row")]
    for module in modules:
        module.pair_weight = None
    linears = [m for m in modules if m.fixed_order and use_pair_order(m.weight)]
    if not linears or not second_copy_allowed(_weight_bytes(linears)):
        return 0
    kernels = load_cpu_kernels()
    for module in linears:
        module.pair_weight = kernels.pair_order_pack(module.weight.detach())
    return len(linears)


def fixed_order_rows(weight: torch.Tensor, batch_invariant: bool) -> int | None:
    """The most rows a fixed-order layer with this weight multiplies by the kernel (``gemm``): any count
    (``None``) in batch-invariant mode and in bfloat16; ``FLOAT32_FIXED_ORDER_ROWS`` for float32 with the
    mode off, where MKL's GEMM is the faster for more."""
    return None if batch_invariant or weight.dtype != torch.float32 else FLOAT32_FIXED_ORDER_ROWS


@functools.cache
def cpu_has_bf16_gemm() -> bool:
    """Whether this CPU's oneDNN has a bfloat16 GEMM (it needs AVX-512 BW/VL/DQ or AVX-NE-CONVERT)."""
    return bool(torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported())


@functools.cache
def _can_prepack() -> bool:
    """Whether this CPU's oneDNN packs bfloat16 weights: it needs AVX-512 (BW, VL, DQ) or
    AVX-NE-CONVERT, and refuses on an AVX2-only CPU; then the plain GEMMs run."""
    if not torch.backends.mkldnn.is_available():
        return False
    try:
        torch.ops.mkldnn._reorder_linear_weight(torch.zeros(16, 16, dtype=torch.bfloat16), PREPACK_BATCH_HINT)
    except RuntimeError as err:
        logger.info("bfloat16 weight prepacking is not available on this CPU (%s); plain GEMMs run", err)
        return False
    return True
