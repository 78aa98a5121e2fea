"""The C++ / OpenMP kernels of ``csrc/cpu``: paged-attention decode and prefill
(paper §4.1; docs/architecture.md, docs/kernels.md) and the fused element-wise
ops of a decoder layer.

The extension is compiled on first use with ``torch.utils.cpp_extension.load``
(``-O3 -march=native -fopenmp``: it is built on the machine that runs it;
``-ffp-contract=off`` keeps every product rounded where the source says, as
PyTorch's own operations round it) into
``$PAGED_EXTENSIONS_DIR`` (default ``~/.cache/paged/torch_extensions``), in a
folder named after the torch version, the CPU's features, a hash of the
sources and a hash of where they and torch are, so a cache shared between
machines never hands one CPU code built for another, nor one checkout a library
built from another's sources, and two checkouts never rebuild each other's. Later imports
reuse the build; ``build_cache.build_lock`` keeps concurrent processes
(pytest workers) from building at once, and no process waits on a build that was killed.

If the build fails, ``load()`` warns once and returns ``None``, and
``paged_attention_decode`` / ``paged_attention_prefill`` fall back to gathering
each sequence's blocks and running SDPA (what step03's reference path does).
Tests call ``load(strict=True)`` so that a broken build fails them instead.

``fused_ops(x)`` hands the model layers the fused ops (``add_rms_norm``, ``gemma_rms_norm``,
``silu_and_mul``, ``rotary_``, ``argmax_rows``; see ``csrc/cpu/fused_ops.cpp``)
when ``x`` can take them: a float32 or bfloat16 CPU tensor under
``torch.inference_mode()`` (the ops have no backward), with the extension
built and ``PAGED_FUSED_OPS`` not ``0`` when this module was imported (``FUSED_OPS``: read once,
not at each of a decode step's 150 calls). Otherwise the layers run their eager
formulas, which the fused ops are tested against.

Invariants: the attention kernels read only the first ``ceil(context_lens[s] / B)``
entries of block-table row ``s`` and only the filled slots of the last block;
they never write the cache. The prefill kernel gives a query token the bits
the decode kernel (not split into partitions) gives it alone, whatever else is
in the call. Layout: the cache of docs/architecture.md, unchanged.
"""

from __future__ import annotations

import functools
import hashlib
import os
import platform
import threading
import warnings
from pathlib import Path

import torch

from paged.kernels.build_cache import build_dir, build_lock, place_key, source_key

_SOURCES = ("bindings.cpp", "paged_attention_avx512.cpp", "paged_prefill_avx512.cpp", "paged_attention_scalar.cpp",
            "paged_attention_avx2.cpp", "fused_ops.cpp", "quant_linear.cpp", "fixed_order_linear.cpp",
            "pair_order_linear.cpp")
_FUSED_DTYPES = (torch.float32, torch.bfloat16)
FUSED_OPS = os.environ.get("PAGED_FUSED_OPS", "1") != "0"  # False: the layers run their eager formulas
_lock = threading.Lock()
_module = None
_error: Exception | None = None  # the build's failure, kept so we warn once


def _source_dir() -> Path:
    """``csrc/cpu`` of the repository (editable install) or inside the package."""
    here = Path(__file__).resolve()
    for candidate in (here.parents[2] / "csrc" / "cpu", here.parents[1] / "csrc" / "cpu"):
        if (candidate / _SOURCES[0]).is_file():
            return candidate
    raise FileNotFoundError(f"csrc/cpu sources not found near {here}")


@functools.cache
def _flags_line() -> str | None:
    """The ``flags`` line of ``/proc/cpuinfo`` (the CPU's feature flags), or None where there is none."""
    try:
        with open("/proc/cpuinfo") as f:
            return next((line for line in f if line.startswith("flags")), "")
    except OSError:
        return None


def cpu_flags() -> frozenset[str]:
    """This CPU's feature flags as Linux names them (``avx512_bf16``, ``amx_bf16``, ...); empty where
    ``/proc/cpuinfo`` is absent."""
    return frozenset((_flags_line() or "").split()[2:])  # past "flags" and ":"


def _cpu_key() -> str:
    """Vector capability plus a hash of the CPU's feature flags: ``-march=native``
    code built for one CPU (say with AVX512-BF16) must not be loaded on another."""
    flags = _flags_line()
    if flags is None:
        flags = platform.processor()
    digest = hashlib.sha1(flags.encode()).hexdigest()[:8]
    return f"{torch.backends.cpu.get_cpu_capability().lower()}-{digest}"


def _build_dir(src: Path) -> Path:
    return build_dir("paged_cpu", _cpu_key(), f"src{source_key(src)}", f"at{place_key(src)}")


def _build(verbose: bool):
    from torch.utils import cpp_extension

    src = _source_dir()
    build_dir = _build_dir(src)
    with build_lock(build_dir, "paged_cpu.so"):
        return cpp_extension.load(
            name="paged_cpu",
            sources=[str(src / name) for name in _SOURCES],
            extra_cflags=["-O3", "-march=native", "-fopenmp", "-ffp-contract=off"],
            extra_ldflags=["-fopenmp"],
            build_directory=str(build_dir),
            verbose=verbose,
        )


def load(verbose: bool = False, *, strict: bool = False):
    """The compiled extension, building it on the first call.

    Args:
        verbose: print the compiler's commands and output.
        strict: raise the build error instead of warning and returning None
            (the tests use it: a broken build must fail CI, not fall back).

    Returns:
        The extension module, or None if the build failed (one warning per
        process; later calls return None at once).
    """
    global _module, _error
    if _module is not None:  # built already: no lock on the per-layer path
        return _module
    with _lock:
        if _module is None and (_error is None or strict):
            try:
                _module = _build(verbose)
                _error = None
            except Exception as exc:  # a compiler error, a missing ninja, ...
                first = _error is None
                _error = exc
                if strict:
                    raise
                if first:
                    warnings.warn(
                        f"paged: building the C++ CPU kernel failed ({type(exc).__name__}: {exc}); "
                        "falling back to the reference attention path",
                        RuntimeWarning,
                        stacklevel=2,
                    )
        return _module


def available() -> bool:
    """Whether the kernel is (or can be) built here."""
    return load() is not None


def paged_attention_decode(
    query: torch.Tensor,  # [S, H, D] one query token per sequence
    key_cache: torch.Tensor,  # [N, B, H_kv, D] = kv[l, 0]
    value_cache: torch.Tensor,  # [N, B, H_kv, D] = kv[l, 1]
    block_tables: torch.Tensor,  # [S, M] int32
    context_lens: torch.Tensor,  # [S] int32, including the current token
    scale: float,
    out: torch.Tensor | None = None,  # [S, H, D]
    partition_blocks: int = -1,
    window: int | None = None,
    softcap: float | None = None,
) -> torch.Tensor:  # [S, H, D]
    """Decode attention of one query per sequence over its paged K/V.

    ``partition_blocks``: -1 lets the AVX-512 kernel split long sequences into
    partitions when the batch is too small for the threads; 0 never splits (a
    query's result then does not depend on the batch: batch-invariant mode).
    ``window`` W: the query at position p sees keys ``p - W + 1 .. p`` only (the
    kernel starts at the block holding the first); ``softcap``: each score s
    becomes ``softcap * tanh(s / softcap)`` before the softmax.

    Query head ``h`` reads KV head ``h // (H // H_kv)``. Sequence ``s`` sees the
    ``context_lens[s]`` tokens in physical blocks ``block_tables[s, :ceil(len/B)]``
    (entries past that are ignored). float32, bfloat16 (float32 accumulation)
    and float64.

    Raises:
        TypeError: a tensor has the wrong dtype.
        ValueError: a shape, layout, context length or block id is out of range, the window is
            below 1, the soft-cap not a finite number above 0.
    """
    module = load()
    if module is None:
        result = _gathered_decode(query, key_cache, value_cache, block_tables, context_lens, scale, window, softcap)
        return result if out is None else out.copy_(result)
    return module.decode(query, key_cache, value_cache, block_tables, context_lens, float(scale), out,
                         partition_blocks=partition_blocks, window=window, softcap=softcap)


def paged_attention_prefill(
    query: torch.Tensor,  # [T, H, D] the new tokens of every sequence, packed in order
    key_cache: torch.Tensor,  # [N, B, H_kv, D] = kv[l, 0], the new tokens' keys written already
    value_cache: torch.Tensor,  # [N, B, H_kv, D] = kv[l, 1]
    block_tables: torch.Tensor,  # [S, M] int32
    context_lens: torch.Tensor,  # [S] int32, cached tokens including the new ones
    query_lens: torch.Tensor,  # [S] int32, new tokens of each sequence
    scale: float,
    out: torch.Tensor | None = None,  # [T, H, D]
    query_tile: int = 32,
    window: int | None = None,
    softcap: float | None = None,
) -> torch.Tensor:  # [T, H, D]
    """Causal attention of many query tokens per sequence over its paged K/V.

    Sequence ``s`` owns query rows ``sum(query_lens[:s]) ...`` (``query_lens[s]``
    of them, 0 allowed); its ``i``-th new token sits at position
    ``context_lens[s] - query_lens[s] + i`` and sees keys ``0 ..`` that position,
    read from physical blocks ``block_tables[s, :ceil(context_lens[s] / B)]``
    (entries past that are ignored). This covers a whole prompt, a chunk of one,
    a prompt's tail over a cached prefix and a decode token (``query_lens[s] =
    1``) in one call. Query head ``h`` reads KV head ``h // (H // H_kv)``.
    ``window`` and ``softcap`` as in ``paged_attention_decode``. float32,
    bfloat16 (float32 accumulation) and float64.

    Each token's result is bitwise what ``paged_attention_decode(...,
    partition_blocks=0)`` gives that token alone (context = its position + 1,
    the same window and soft-cap): the KV blocks are walked at absolute
    positions, in the decode kernel's order and arithmetic, a window's first
    block fixed by the token's position. ``query_tile`` (query tokens per work
    item) changes only the speed.

    Raises:
        TypeError: a tensor has the wrong dtype.
        ValueError: a shape or layout is wrong, a length is out of range
            (``0 <= query_lens[s] <= context_lens[s] <= M * B``, ``sum(query_lens) == T``),
            a block id is not a block of the cache, the window is below 1, the
            soft-cap not a finite number above 0.
    """
    module = load()
    if module is None:
        result = _gathered_prefill(query, key_cache, value_cache, block_tables, context_lens, query_lens, scale,
                                   window, softcap)
        return result if out is None else out.copy_(result)
    return module.prefill(query, key_cache, value_cache, block_tables, context_lens, query_lens, float(scale), out,
                          query_tile=query_tile, window=window, softcap=softcap)


def _gathered_decode(query, key_cache, value_cache, block_tables, context_lens, scale, window=None,
                     softcap=None) -> torch.Tensor:
    """The decode path without the kernel: ``_gathered_prefill`` with one query per sequence."""
    ones = torch.ones(len(context_lens), dtype=torch.int32)
    return _gathered_prefill(query, key_cache, value_cache, block_tables, context_lens, ones, scale, window, softcap)


def _gathered_prefill(query, key_cache, value_cache, block_tables, context_lens, query_lens, scale, window=None,
                      softcap=None) -> torch.Tensor:
    """The path without the kernel: each sequence's blocks copied into contiguous K/V, then SDPA.

    The same computation as step03's ``reference_attention``, written against
    ``paged.models`` only: kernels sit below the steps. Bad lengths, windows and
    soft-caps raise the kernel's errors.
    """
    from paged.kernels.contiguous import causal_attention, check_window_and_softcap

    check_window_and_softcap(window, softcap)

    block_size = key_cache.shape[1]
    ctx, q_lens = context_lens.tolist(), query_lens.tolist()
    if len(q_lens) != len(ctx) or sum(q_lens) != query.shape[0]:
        raise ValueError(f"query_lens {q_lens} must have one entry per sequence ({len(ctx)}) "
                         f"and sum to the query's {query.shape[0]} token rows")
    out = torch.empty_like(query)  # [T, H, D]
    start = 0
    for s, (n, q) in enumerate(zip(ctx, q_lens)):
        if not 0 <= q <= n <= block_tables.shape[1] * block_size:
            raise ValueError(f"sequence {s}: needs 0 <= query_lens ({q}) <= context_lens ({n}) "
                             f"<= M * B = {block_tables.shape[1] * block_size}")
        if q == 0:
            continue
        blocks = block_tables[s, : -(-n // block_size)].long()
        k = key_cache.index_select(0, blocks).flatten(0, 1)[:n]  # [n, H_kv, D]
        v = value_cache.index_select(0, blocks).flatten(0, 1)[:n]
        out[start : start + q] = causal_attention(query[start : start + q], k, v, scale, window, softcap)
        start += q
    return out


def write_kv(
    key_cache: torch.Tensor,  # [N, B, H_kv, D]
    value_cache: torch.Tensor,  # [N, B, H_kv, D]
    k: torch.Tensor,  # [T, H_kv, D]
    v: torch.Tensor,  # [T, H_kv, D]
    slot_mapping: torch.Tensor,  # [T] int64, slot = block * B + offset; < 0 skipped
) -> None:
    """Store new tokens' keys and values at their slots (the paper's fused write)."""
    module = load()
    if module is not None:
        module.write_kv(key_cache, value_cache, k, v, slot_mapping)
        return
    keep = slot_mapping >= 0
    slots = slot_mapping[keep]
    key_cache.view(-1, *key_cache.shape[2:])[slots] = k[keep]
    value_cache.view(-1, *value_cache.shape[2:])[slots] = v[keep]


def fused_ops(x: torch.Tensor):
    """The extension, if ``x`` may take its fused ops (see the module doc); else None."""
    if x.device.type != "cpu" or x.dtype not in _FUSED_DTYPES or not torch.is_inference_mode_enabled():
        return None
    return load() if FUSED_OPS else None
