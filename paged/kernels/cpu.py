"""The C++ / OpenMP kernels of ``csrc/cpu``: paged-attention decode (paper §4.1;
docs/architecture.md)
and the fused element-wise ops of a decoder layer.

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
``paged_attention_decode`` falls back to gathering each sequence's blocks and
running SDPA (what step03's reference path does).
Tests call ``load(strict=True)`` so that a broken build fails them instead.

``fused_ops(x)`` hands the model layers the fused ops (``add_rms_norm``,
``silu_and_mul``, ``rotary_``, ``argmax_rows``; see ``csrc/cpu/fused_ops.cpp``)
when ``x`` can take them: a float32 or bfloat16 CPU tensor under
``torch.inference_mode()`` (the ops have no backward), with the extension
built and ``PAGED_FUSED_OPS`` not ``0``. Otherwise the layers run their eager
formulas, which the fused ops are tested against.

Invariants: the decode kernel reads only the first ``ceil(context_lens[s] / B)``
entries of block-table row ``s`` and only the filled slots of the last block;
it never writes the cache. Layout: the cache of docs/architecture.md, unchanged.
"""

from __future__ import annotations

import hashlib
import os
import platform
import threading
import warnings
from pathlib import Path

import torch

from paged.kernels.build_cache import build_dir, build_lock, place_key, source_key

_SOURCES = ("bindings.cpp", "paged_attention_avx512.cpp", "paged_attention_scalar.cpp", "fused_ops.cpp",
            "quant_linear.cpp")
_FUSED_DTYPES = (torch.float32, torch.bfloat16)
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


def _cpu_key() -> str:
    """Vector capability plus a hash of the CPU's feature flags: ``-march=native``
    code built for one CPU (say with AVX512-BF16) must not be loaded on another."""
    flags = ""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line for line in f if line.startswith("flags")), "")
    except OSError:
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
) -> torch.Tensor:  # [S, H, D]
    """Decode attention of one query per sequence over its paged K/V.

    ``partition_blocks``: -1 lets the AVX-512 kernel split long sequences into
    partitions when the batch is too small for the threads; 0 never splits (a
    query's result then does not depend on the batch: batch-invariant mode).

    Query head ``h`` reads KV head ``h // (H // H_kv)``. Sequence ``s`` sees the
    ``context_lens[s]`` tokens in physical blocks ``block_tables[s, :ceil(len/B)]``
    (entries past that are ignored). float32, bfloat16 (float32 accumulation)
    and float64.

    Raises:
        TypeError: a tensor has the wrong dtype.
        ValueError: a shape, layout, context length or block id is out of range.
    """
    module = load()
    if module is None:
        result = _gathered_decode(query, key_cache, value_cache, block_tables, context_lens, scale)
        return result if out is None else out.copy_(result)
    return module.decode(query, key_cache, value_cache, block_tables, context_lens, float(scale), out,
                         partition_blocks=partition_blocks)


def _gathered_decode(query, key_cache, value_cache, block_tables, context_lens, scale) -> torch.Tensor:
    """The path without the kernel: each sequence's blocks copied into contiguous K/V, then SDPA.

    The same computation as step03's ``reference_attention`` for one query per
    sequence, written against ``paged.models`` only: kernels sit below the steps.
    """
    from paged.kernels.contiguous import causal_attention

    block_size = key_cache.shape[1]
    out = torch.empty_like(query)  # [S, H, D]
    for s, n in enumerate(context_lens.tolist()):
        blocks = block_tables[s, : -(-n // block_size)].long()
        k = key_cache.index_select(0, blocks).flatten(0, 1)[:n]  # [n, H_kv, D]
        v = value_cache.index_select(0, blocks).flatten(0, 1)[:n]
        out[s : s + 1] = causal_attention(query[s : s + 1], k, v, scale)
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
    if os.environ.get("PAGED_FUSED_OPS", "1") == "0":
        return None
    return load()
