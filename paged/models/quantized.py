"""``quantization="gguf"``: a GGUF model's linear layers multiply by the file's quantized blocks.

By default a GGUF file's weights are dequantized once into the model's dtype
(``gguf_loader``) and every linear layer is a dense GEMM. With
``LLM(model="model.gguf", quantization="gguf")`` (vLLM's spelling) the
linears whose tensors are in a format the C++ kernel reads (Q4_0, Q4_1, Q5_0, Q8_0, Q4_K, Q6_K)
keep the file's bytes instead and ``QuantizedLinear`` multiplies by them
directly (``csrc/cpu/quant_linear.cpp``). Generating one token reads every
weight once; SmolLM2-135M's Q4_1 + Q8_0 file is 97 MB where its bfloat16
weights are 270 MB, and at one sequence a decode step waits on those bytes.
Where the kernel's AVX2 loops are built (and with them, on a CPU with AVX-512
VNNI, the VNNI ones), serving lays the blocks out
again with one output column per vector lane (``pack_lane_linears``), so
they are read as one stream; the lanes then replace the row layout, which they
give back byte for byte when asked (``QuantizedLinear.row_blocks``).

What stays the same: the embedding lookup, the norms and attention (dense,
from the same load). What changes is the rounding: the kernel rounds each block
of 32 activations to int8 (llama.cpp's scheme, ``quantize_activations``) and
multiplies integers exactly, so it equals the dequantized weights
(``dequantize_blocks``, bitwise gguf's own dequantizer) times the rounded
activations up to float32 rounding (``tests/kernels/test_quant_linear.py``
states the bounds). The dense path multiplies the unrounded activations by
the same weights rounded to bfloat16; the two may pick a different token
where two are nearly tied.

A block is 32 consecutive weights of one row: a float16 scale ``d`` (Q4_1:
and an offset ``m``) and 32 integers ``q``; ``w = d * (q - 8)`` (Q4_0),
``d * q + m`` (Q4_1), ``d * (q - 16)`` (Q5_0: a fifth bit per weight, the 32 of
a block in one 32-bit word ``qh``), ``d * q`` (Q8_0). Each format's bytes are mapped straight
from the file, at the offsets of the tensor table the load's conversion kept
(``gguf_reader.tensor_table``): no header is parsed again.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable

import numpy as np
import torch
from torch import nn

from paged.kernels.cpu import load as load_cpu_kernels
from paged.models.config import ModelLoadError
from paged.models.gguf_names import hf_tensor_name, permuted_projections, unpermute_rows
from paged.models.kquants import K_FORMATS, QK_K, dequantize_kquant
from paged.models.layers import (THREADS_SPIN, Linear, MergedLinear, cpu_has_bf16_gemm, huge_page_parts,
                                  second_copy_allowed)

QUANTIZATIONS = ("gguf",)  # the values of LLM(quantization=...) besides None
# ggml type number -> (name, bytes per block of 32 weights) for the 32-weight formats the kernel reads
BLOCK_FORMATS = {2: ("Q4_0", 18), 3: ("Q4_1", 20), 6: ("Q5_0", 22), 8: ("Q8_0", 34)}
QK = 32  # weights per block
# The weights x rows from which a quantized linear call takes a second thread (speed only, the same
# bits): where idle threads spin, from 256 K; where they sleep, the kernel's own rule for its loop
# (None; csrc/cpu/quant_linear.cpp, MIN_TASK_WEIGHTS).
SECOND_THREAD_WEIGHTS = 256 << 10 if THREADS_SPIN else None
# every format the kernel reads: the block formats and the K-quants of a Q4_K_M file
KERNEL_FORMATS = {**{kind: name for kind, (name, _) in BLOCK_FORMATS.items()}, 12: "Q4_K", 14: "Q6_K"}


def row_bytes(kind: int, k: int) -> int:
    """Bytes of one row of ``k`` weights as the file stores them."""
    if kind in K_FORMATS:
        return k // QK_K * K_FORMATS[kind][1]
    return k // QK * BLOCK_FORMATS[kind][1]


# --- the layer ---------------------------------------------------------------------------------

def row_layout(kind: int, k: int) -> tuple[int, int, int]:
    """``(blocks, q bytes per block, bytes per row)`` of a packed row: the block count padded to even."""
    blocks = k // QK + (k // QK) % 2
    q_bytes = 32 if kind == 8 else 16
    return blocks, q_bytes, blocks * BLOCK_FORMATS[kind][1]


def pack_blocks(raw: np.ndarray, kind: int, n: int, k: int) -> torch.Tensor:
    """GGUF's blocks of a ``[n, k]`` weight, one row after another, regrouped for the kernel: per row all
    the q bytes, then all the float16 scales d, then all the offsets m (Q4_1) or all the 32-bit words of
    high bits qh (Q5_0), with a zero block added
    when the row has an odd count. Same bytes; four blocks' q become one 64-byte load. K-quants keep
    the file's layout (the kernel reads their super-blocks in place)."""
    if kind in K_FORMATS:
        return torch.from_numpy(np.ascontiguousarray(raw, dtype=np.uint8).reshape(-1).copy())
    size = BLOCK_FORMATS[kind][1]
    per_row = k // QK
    blocks = np.asarray(raw, dtype=np.uint8).reshape(n, per_row, size)
    padded, _, _ = row_layout(kind, k)
    if padded != per_row:
        blocks = np.concatenate([blocks, np.zeros((n, padded - per_row, size), np.uint8)], axis=1)
    if kind == 3:  # Q4_1: d | m | 16 bytes
        parts = (blocks[:, :, 4:], blocks[:, :, 0:2], blocks[:, :, 2:4])
    elif kind == 6:  # Q5_0: d | qh | 16 bytes
        parts = (blocks[:, :, 6:], blocks[:, :, 0:2], blocks[:, :, 2:6])
    else:  # Q4_0: d | 16 bytes; Q8_0: d | 32 bytes
        parts = (blocks[:, :, 2:], blocks[:, :, 0:2])
    return torch.from_numpy(np.concatenate([p.reshape(n, -1) for p in parts], axis=1).reshape(-1))


def dequantize_blocks(packed: torch.Tensor, kind: int, n: int, k: int) -> torch.Tensor:
    """The weights of a packed ``[n, k]`` weight as float32 ``[n, k]``: the formulas, one torch op at a time
    (the K-quants': ``kquants.dequantize_kquant``)."""
    if kind in K_FORMATS:
        return dequantize_kquant(packed, kind, n, k)
    blocks, q_bytes, row_bytes = row_layout(kind, k)
    rows = packed.reshape(n, row_bytes)
    q = rows[:, : blocks * q_bytes].reshape(n, blocks, q_bytes)
    d = rows[:, blocks * q_bytes : blocks * (q_bytes + 2)].contiguous().view(torch.float16).float()[..., None]
    if kind == 8:  # Q8_0
        w = d * q.contiguous().view(torch.int8).float()
    else:
        nibbles = torch.cat((q & 0xF, q >> 4), dim=-1).float()  # weights 0..15 in the low nibbles, 16..31 high
        if kind == 2:  # Q4_0
            w = d * (nibbles - 8)
        elif kind == 6:  # Q5_0: bit j of the block's qh is weight j's fifth bit
            qh = rows[:, blocks * (q_bytes + 2):].contiguous().view(torch.int32).reshape(n, blocks, 1)
            high = (qh >> torch.arange(32, dtype=torch.int32)) & 1
            w = d * (nibbles + 16 * high - 16)
        else:  # Q4_1: rounded after the product, then after the sum
            m = rows[:, blocks * (q_bytes + 2):].contiguous().view(torch.float16).float()[..., None]
            w = d * nibbles + m
    return w.reshape(n, blocks * QK)[:, :k]


def quantize_activations(x: torch.Tensor) -> torch.Tensor:
    """What the kernel multiplies by: each block of 32 values of each row rounded to int8 with the scale
    ``max|x| / 127``, as float32 (``x``'s rows ``[.., K]``, K a multiple of 32)."""
    v = x.float().reshape(*x.shape[:-1], -1, QK)
    d = v.abs().amax(-1, keepdim=True) / 127.0
    inv = torch.where(d != 0, 1.0 / d, torch.zeros_like(d))
    q = torch.round(v * inv).clamp(-127, 127)  # round: ties to even, as the kernel's conversion
    return (q * d).reshape(x.shape)


DENSE_ROWS = 2  # QuantizedLinear.dense_rows: more rows than this run the dense GEMM (measured crossover)


def dense_is_faster_for_many_rows(dtype: torch.dtype) -> bool:
    """Whether batches of many rows should leave the kernel for a dense layer of weights in ``dtype``: not
    for bfloat16 weights on a CPU
    whose oneDNN has no bfloat16 GEMM (AVX2 only), where torch's bfloat16 GEMM is 4-5x slower than the
    kernel's AVX2 loop at 1 to 256 rows; yes otherwise (bfloat16 with AVX-512: the GEMM 3-4x faster at 64
    rows; float32: MKL's GEMM, 1.3-1.4x faster from 64 rows on AVX2), and without the kernel built. The
    dense layer multiplies as any dense linear does (``layers.gemm``): on an AVX2 CPU in float32, calls of up
    to ``layers.FLOAT32_FIXED_ORDER_ROWS`` rows by the fixed-order kernel, faster again there (1.2-1.35x the
    output tokens per second of MKL's GEMM, ``python -m paged.bench engine --workload batch``)."""
    return dtype != torch.bfloat16 or cpu_has_bf16_gemm() or load_cpu_kernels() is None


class QuantizedLinear(nn.Module):
    """A bias-free linear layer ``x @ W.T`` whose ``W [out, in]`` is GGUF blocks (``blocks``: ``pack_blocks``'s).

    ``output_sizes`` and ``split`` are ``MergedLinear``'s, for the fused q|k|v and gate|up layers.

    Which path runs, for ``x`` of ``T`` rows:

    * ``T <= dense_rows`` (decode: one or two sequences), or ``dense_rows`` None: the C++
      kernel over the blocks, on a CPU with the kernel built (over ``lane_blocks`` once
      ``pack_lane_linears`` gave the layer them). Otherwise (no compiler) the
      weight is dequantized at every call and multiplied in float32: slow, equal to the kernel
      up to float32 rounding.
    * more rows (a prompt, a batch): ``dense``, a dense layer of the weight dequantized once,
      when there is one: ``use_kernel_only(False)`` (serving with the mode off) makes it where it
      is the faster (``dense_is_faster_for_many_rows``). A matrix
      product of many rows is limited by arithmetic, not by reading weights, and there a
      GEMM's bfloat16 dot products (oneDNN, AVX-512) beat the kernel's integer ones, which
      widen and scale each block again for every row (measured 3-4x at 64 rows; in lanes about even
      at 64, the GEMM ahead from about 128); on an
      AVX2-only CPU torch has no fast bfloat16 GEMM, and the kernel stays faster.

    The two paths round differently, so a row's bits would depend on the batch it is in;
    in batch-invariant mode ``use_kernel_only(True)`` keeps ``dense_rows`` None: always the
    kernel (``CausalLM.prepare_for_serving`` asks it).

    Memory: the layer holds a dense layer only while that can run. As loaded it has none (the
    loader never dequantizes the weights it replaces: ``gguf_loader``), nor in batch-invariant
    mode, the default, nor where the kernel is the faster at every row count (a bfloat16 model on
    a CPU without a bfloat16 GEMM): then it holds the file's blocks, in one layout (``blocks``, or
    once laid out in lanes ``lane_blocks`` and ``blocks`` None), no more. The
    dense layer the mode off makes (``dense_from_blocks``) holds the weights the dense load would
    (the same formulas, bit for bit), and is let go again if the mode comes back on.

    Args:
        blocks: the weight's blocks, ``pack_blocks``'s layout.
        kind: the ggml type number (``KERNEL_FORMATS``).
        out_features, in_features: the weight's shape.
        output_sizes: the parts of a fused layer, in output order.
        dense_dtype: the dtype of a dense layer made from the blocks; None: the layer never makes one.
    """

    def __init__(self, blocks: torch.Tensor, kind: int, out_features: int, in_features: int,
                 output_sizes: tuple[int, ...] | None = None, dense_dtype: torch.dtype | None = None):
        super().__init__()
        if kind not in KERNEL_FORMATS:
            raise ValueError(f"block type {kind} is not one of {sorted(KERNEL_FORMATS)}")
        self.register_buffer("blocks", blocks)  # None once the lanes replace them (pack_lane_linears)
        self.kind, self.out_features, self.in_features = kind, out_features, in_features
        self.output_sizes = tuple(output_sizes or (out_features,))
        self.dense_dtype = dense_dtype
        self.dense: Linear | None = None  # made by use_kernel_only(False) where it is the faster for many rows
        self.dense_rows: int | None = None  # more rows than this go to ``dense``; None: every row to the kernel
        self.lane_blocks: torch.Tensor | None = None  # the blocks in the lanes layout (pack_lane_linears)

    @property
    def format(self) -> str:
        return KERNEL_FORMATS[self.kind]

    def split(self, y: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return y.split(self.output_sizes, dim=-1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [T, in] -> [T, out]
        if self.dense_rows is not None and x.shape[0] > self.dense_rows:  # None without a dense layer
            return self.dense(x)
        kernels = load_cpu_kernels() if x.device.type == "cpu" and x.dtype in (torch.float32, torch.bfloat16) else None
        if kernels is not None and x.dim() == 2:
            x = x if x.stride(-1) == 1 else x.contiguous()
            if self.lane_blocks is not None:  # the same sums, one output column per vector lane
                return kernels.quant_linear_lanes(x, self.lane_blocks, self.kind, self.out_features,
                                                  self.in_features, "auto", SECOND_THREAD_WEIGHTS)
            return kernels.quant_linear(x, self.blocks, self.kind, self.out_features, self.in_features, "auto",
                                        SECOND_THREAD_WEIGHTS)
        weight = dequantize_blocks(self.row_blocks(), self.kind, self.out_features, self.in_features).to(x.device)
        return torch.nn.functional.linear(quantize_activations(x), weight).to(x.dtype)

    def kernel_call(self) -> Callable[[torch.Tensor], torch.Tensor] | None:
        """The one call ``forward`` makes for every 2-D CPU ``x`` in float32 or bfloat16, bound now, once the
        layer always takes the lanes kernel (its blocks laid out in lanes, no dense layer for many rows);
        None otherwise. Read by the unrolled pass (``paged.models.unrolled``)."""
        kernels = load_cpu_kernels()
        if self.lane_blocks is None or self.dense_rows is not None or kernels is None:
            return None
        lanes, kind, n, k, lanes_linear = (self.lane_blocks, self.kind, self.out_features, self.in_features,
                                           kernels.quant_linear_lanes)
        return lambda x: lanes_linear(x if x.stride(-1) == 1 else x.contiguous(), lanes, kind, n, k, "auto",
                                      SECOND_THREAD_WEIGHTS)

    def row_blocks(self) -> torch.Tensor:
        """The blocks in the row layout (``pack_blocks``'): ``blocks``, or, once the lanes replaced them,
        unpacked from the lanes (``quant_unpack_lanes``: the same bytes)."""
        if self.blocks is not None:
            return self.blocks
        return load_cpu_kernels().quant_unpack_lanes(self.lane_blocks, self.kind, self.out_features, self.in_features)

    def lay_out_in_rows(self) -> None:
        """Back to the row layout: the blocks from the lanes, the lanes let go."""
        self.blocks, self.lane_blocks = self.row_blocks(), None

    def use_kernel_only(self, only: bool, weight: torch.Tensor | None = None) -> None:
        """Run the kernel at every row count (``only``), or hand batches of more than ``DENSE_ROWS``
        rows to the dense layer where it is the faster for them. A dense layer that will not run is let
        go (its weights freed); one that will is made again if it was: with ``weight``, the dense weight
        when the model holds it already (a tied LM head: the token embedding's, the same values), else
        from the blocks."""
        many_rows_dense = self.dense_dtype is not None and dense_is_faster_for_many_rows(self.dense_dtype)
        if many_rows_dense and not only:
            if self.dense is None:
                self.dense = self.dense_from_blocks(weight)
            self.dense_rows = DENSE_ROWS
        else:
            self.dense, self.dense_rows = None, None

    def dense_from_blocks(self, weight: torch.Tensor | None = None) -> Linear:
        """A dense layer whose weight is the blocks dequantized (``dequantize_blocks``) into ``dense_dtype``, or
        ``weight`` itself (shared, not copied) when given."""
        with torch.device("meta"):  # no weight drawn at random only to be replaced
            dense = Linear(self.in_features, self.out_features, bias=False)
        if weight is None:
            weight = dequantize_blocks(self.row_blocks(), self.kind, self.out_features, self.in_features)
            weight = nn.Parameter(weight.to(self.dense_dtype).contiguous(), requires_grad=False)
        dense.weight = weight
        return dense

    @property
    def rows_independent(self) -> bool:
        """Whether an output row's bits do not depend on how many rows come with it: true when only the
        kernel runs (it sums a row the same way whatever the row count; a dense GEMM of one row may
        round differently from one of two)."""
        return self.dense_rows is None

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, format={self.format}, "
                f"dense_rows={self.dense_rows}")



def pack_lane_linears(model: nn.Module) -> int:
    """Give every ``QuantizedLinear`` of ``model`` its blocks laid out again with one output column per vector
    lane (``lane_blocks``, ``csrc/cpu/quant_linear_lanes.h``) in place of the row layout; returns how many.

    Only where the kernel's AVX2 loops are built (a CPU with AVX-512 VNNI reads the lanes with those). At
    one or two rows of x a layer should be as fast as its weights arrive from memory (a decode step reads
    every layer once); in the row layout, summing each output across 16 lanes and adding them up at the
    end, SmolLM2's Q4_1 linears took 9.6 ms at one row, in lanes 4.7 (Zen 4, ``python -m paged.bench
    quant_kernel --cold``, docs/benchmarks.md); on an AVX2-only Zen 3 the lanes' AVX2 loop beat the row
    layout's too (docs/benchmarks.md). The layout gives each output its own lane, so no sum crosses lanes.
    All the layers' lanes lie in one allocation on huge pages (``layers.huge_page_parts``): a decode step
    streams them once each, and on ordinary pages one stream's speed varied with where they lay. The
    lanes replace the row layout: every layer is laid out, then the row layouts go. What reads the row
    layout (the dense layer the mode off makes, ``dequantize_blocks``) gets it back from the lanes, byte
    for byte (``QuantizedLinear.row_blocks``). Laying them out follows the
    rule of the other laid-out copies (``layers.second_copy_allowed``: ``PAGED_PREPACK_WEIGHTS=0`` keeps
    the row layout). The outputs are the row layout's up to float32 rounding (each sums the blocks in a
    fixed order of its own); a row's bits still do not depend on the batch. Called by
    ``CausalLM.prepare_for_serving``; again, it first puts every layer back in the row layout."""
    layers = [m for m in model.modules() if isinstance(m, QuantizedLinear)]
    for layer in layers:
        if layer.lane_blocks is not None:
            layer.lay_out_in_rows()
    kernels = load_cpu_kernels()
    layers = [m for m in layers if m.blocks.device.type == "cpu"]
    if not layers or kernels is None or not kernels.quant_avx2_compiled():
        return 0
    if not second_copy_allowed(sum(m.blocks.numel() for m in layers)):
        return 0
    places = huge_page_parts([kernels.quant_lanes_bytes(m.kind, m.out_features, m.in_features) for m in layers])
    for layer, lanes in zip(layers, places):
        layer.lane_blocks = kernels.quant_pack_lanes(layer.blocks, layer.kind, layer.out_features,
                                                     layer.in_features, into=lanes)
    for layer in layers:  # every layer laid out before any row layout goes
        layer.blocks = None
    return len(layers)


# --- putting the layers into a model -----------------------------------------------------------

def plan_quantized_linears(model: nn.Module, tensors: dict[str, list]) -> dict[str, list[tuple]]:
    """Which linears of ``model`` take the file's blocks, and from which tensors.

    Args:
        model: built for the GGUF file's config (on the meta device is enough: names and shapes are read).
        tensors: the file's tensor table (``gguf_reader.tensor_table``): GGUF name -> ``[type, shape, offset,
            bytes]``.

    Returns:
        module name -> its parts in output order, each ``(checkpoint name, rows, GGUF name, type, shape,
        offset, bytes)``. A linear with a bias, or whose parts (q, k, v of a fused layer) come in different formats
        or in one the kernel does not read (Q5_1, Q2_K, Q3_K, Q5_K, float16, ...), is not in it: it stays
        dense. A tied LM head is, with the token embedding's tensor (the embedding itself stays dense for
        the lookup).
    """
    config = model.config
    by_hf = {hf_tensor_name(name, config.model_type): (name, kind, tuple(shape), offset, nbytes)
             for name, (kind, shape, offset, nbytes) in tensors.items()}
    layout = model.checkpoint_layout()
    if config.tie_word_embeddings:
        layout["lm_head.weight"] = [("model.embed_tokens.weight", 0, config.vocab_size)]
    plan = {}
    for name, module in model.named_modules():
        if type(module) not in (Linear, MergedLinear) or module.bias is not None:
            continue
        parts = layout.get(f"{name}.weight", [])
        found = [by_hf.get(ck) for ck, _, _ in parts]
        if not parts or None in found or any(not _readable(f[1], f[2]) for f in found):
            continue  # not in the file, or a format the kernel does not read: stays dense
        if len({f[1] for f in found}) == 1:  # parts in mixed formats: stays dense
            plan[name] = [(ck, n, *f) for (ck, _, n), f in zip(parts, found)]
    return plan


def quantize_linears(model: nn.Module, path: Path, tensors: dict[str, list], dtype: torch.dtype) -> list[str]:
    """Replace the linears of ``model`` that ``plan_quantized_linears`` names by ``QuantizedLinear`` layers over
    the GGUF file's blocks; returns their names. ``model`` may be on the meta device: the replaced layers'
    dense weights are never made (``gguf_loader`` leaves them out); a layer makes one in ``dtype`` from its
    blocks if the mode off asks (``QuantizedLinear.use_kernel_only``).

    Args:
        model: built for the GGUF file ``path``.
        path: the GGUF file.
        tensors: its tensor table (``gguf_reader.tensor_table``).
        dtype: the model's dtype, that of the dense layers made from the blocks.
    """
    size = os.path.getsize(path)
    unpermute = permuted_projections(model.config)
    plan = plan_quantized_linears(model, tensors)
    with open(path, "rb") as file:
        for name, parts in plan.items():
            module = model.get_submodule(name)
            n_out, n_in = module.weight.shape
            rows = []
            for ck, n, gguf_name, kind, shape, offset, nbytes in parts:
                if shape != (n, n_in):
                    raise ModelLoadError(f"{path}: tensor {gguf_name!r} has shape {list(shape)}, {name} needs "
                                         f"[{n}, {n_in}]")
                if offset + nbytes > size or nbytes != n * row_bytes(kind, n_in):
                    raise ModelLoadError(f"{path}: tensor {gguf_name!r} runs past the end of the file (truncated?)")
                # read, not mapped: a mapped file's pages would count as this process's memory until the
                # end of the load (Gemma 3's 262 144-row embedding blocks among them)
                file.seek(offset)
                block_rows = np.fromfile(file, dtype=np.uint8, count=nbytes).reshape(n, -1)
                proj = ck.split(".")[-2]
                if proj in unpermute:
                    block_rows = unpermute_rows(torch.from_numpy(block_rows), unpermute[proj]).numpy()
                rows.append(block_rows)
            kind = parts[0][3]
            packed = pack_blocks(rows[0] if len(rows) == 1 else np.concatenate(rows), kind, n_out, n_in)
            sizes = module.output_sizes if isinstance(module, MergedLinear) else None
            parent_name, _, leaf = name.rpartition(".")
            setattr(model.get_submodule(parent_name), leaf, QuantizedLinear(packed, kind, n_out, n_in, sizes, dtype))
    return list(plan)


def _readable(kind: int, shape: tuple[int, ...]) -> bool:
    """Whether the kernel reads a tensor of this type and shape: its format, 2-D, whole blocks per row."""
    return kind in KERNEL_FORMATS and len(shape) == 2 and shape[-1] % (QK_K if kind in K_FORMATS else QK) == 0
