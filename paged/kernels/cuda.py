"""The CUDA kernels of ``csrc/cuda`` (paper §4.1 and §5; docs/architecture.md).

Four operations for CUDA tensors, behind the same shapes as every other path:

* ``paged_attention_v1`` / ``paged_attention_v2`` — decode attention (one query
  token per sequence) over the paged cache: v1 gives one thread block to each
  (sequence, query head); v2 also splits the context into partitions and reduces
  them (flash-decoding), for long contexts with few sequences.
* ``write_kv`` — the paper's fused reshape-and-write of new keys and values into
  their slots (``block * B + offset``); negative slots are padding, skipped.
* ``copy_blocks`` — the fused block copy: (src, dst) pairs copied across all
  layers, keys and values, in one launch (copy-on-write, step04).

Layout: the cache of docs/architecture.md, unchanged — ``kv [L, 2, N, B, H_kv, D]``, a
layer's keys the view ``kv[l, 0]`` ``[N, B, H_kv, D]``. The kernels read it
directly (no x-split key layout): a token's D elements of one head are
contiguous, which is what their coalesced loads need.

The extension (``csrc/cuda/*.cu`` plus ``binding.cpp``) is compiled on first use
with ``torch.utils.cpp_extension.load`` into ``$PAGED_EXTENSIONS_DIR`` (default
``~/.cache/paged/torch_extensions``), in a folder named after the torch and CUDA
versions and the GPU's compute capability, for the architectures torch's
builder picks (``TORCH_CUDA_ARCH_LIST``, else the visible GPU's). It needs a GPU:
without one ``load`` raises ``RuntimeError`` and ``available()`` is False.
``load(verbose=True)`` prints the compiler commands and ptxas's register and
shared-memory report of every kernel. Compiled for block sizes
8, 16, 32 and head dims 32, 64, 80, 96, 128; float32, float16, bfloat16.

Caller's contract (not checked, it would cost a device synchronisation):
``context_lens[s] <= M * B``; block-table entries, slots and block ids lie in
``[0, N)`` (``[0, N * B)`` for slots); ``copy_blocks`` destinations are
distinct and are not sources of other pairs. ``copy_blocks`` checks the pairs'
range when they are given on the CPU.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import threading
from pathlib import Path

import torch

from paged.kernels.build_cache import build_dir, build_lock, place_key

__all__ = ["available", "copy_blocks", "load", "paged_attention_decode", "paged_attention_v1", "paged_attention_v2",
           "select_version", "write_kv"]  # fmt: skip

_KERNELS = ("paged_attention_v1.cu", "paged_attention_v2.cu", "cache_ops.cu")
_BINDING = "binding.cpp"
_HEADERS = ("ops.h", "common.cuh", "paged_attention.cuh")
_lock = threading.Lock()
_module = None


def source_dir() -> Path:
    """``csrc/cuda`` of the repository (editable install) or inside the package."""
    here = Path(__file__).resolve()
    for candidate in (here.parents[2] / "csrc" / "cuda", here.parents[1] / "csrc" / "cuda"):
        if (candidate / _BINDING).is_file():
            return candidate
    raise FileNotFoundError(f"csrc/cuda sources not found near {here}")


def _build_dir() -> Path:
    major, minor = torch.cuda.get_device_capability()
    return build_dir("paged_cuda", f"cuda{torch.version.cuda}", f"sm{major}{minor}", f"at{place_key(source_dir())}")


def toolkit_home() -> Path | None:
    """The CUDA toolkit's folder: ``CUDA_HOME`` or ``CUDA_PATH`` when set, else the one the ``nvcc`` on PATH
    compiles with, as it reports it itself (``nvcc --dryrun``'s ``TOP``: ``nvcc`` may be a wrapper script,
    ``/usr/local/bin/nvcc`` running the toolkit's); None without ``nvcc``."""
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if home:
        return Path(home)
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        return None
    err = subprocess.run([nvcc, "--dryrun", "-c", "-x", "cu", os.devnull], capture_output=True, text=True,
                         timeout=60).stderr
    for line in err.splitlines():
        if line.startswith("#$ TOP="):
            return Path(line.split("=", 1)[1].strip()).resolve()
    return Path(nvcc).resolve().parents[1]


def point_builder_at_toolkit(cpp_extension) -> None:
    """Give torch's extension builder (the module ``cpp_extension``) the toolkit ``toolkit_home`` finds when the
    one it guessed has no ``include/cuda_runtime.h``: given no ``CUDA_HOME`` it takes the folder above the
    folder of ``nvcc``, which for a wrapper script is not the toolkit, and the build fails there."""
    guessed = cpp_extension.CUDA_HOME
    if guessed is not None and (Path(guessed) / "include" / "cuda_runtime.h").is_file():
        return
    home = toolkit_home()
    if home is not None and (home / "include" / "cuda_runtime.h").is_file():
        cpp_extension.CUDA_HOME = str(home)


def load(verbose: bool = False):
    """The compiled extension, building it on the first call (minutes with nvcc).

    Args:
        verbose: print the compiler's commands and output.

    Raises:
        RuntimeError: no CUDA GPU is visible to torch, or the build failed
            (the compiler's error is chained as the cause).
    """
    global _module
    if _module is not None:
        return _module
    if not torch.cuda.is_available():
        raise RuntimeError(
            "paged.kernels.cuda needs a CUDA GPU: torch.cuda.is_available() is False "
            f"(torch {torch.__version__}, built with CUDA {torch.version.cuda})"
        )
    with _lock:
        if _module is None:
            from torch.utils import cpp_extension

            point_builder_at_toolkit(cpp_extension)
            src = source_dir()
            # cpp_extension rebuilds when the sources or the flags change; fold the
            # headers into the flags so that editing a header rebuilds too.
            digest = hashlib.sha1(b"".join((src / h).read_bytes() for h in _HEADERS)).hexdigest()[:12]
            try:
                folder = _build_dir()
                with build_lock(folder, "paged_cuda.so"):
                    _module = cpp_extension.load(
                        name="paged_cuda",
                        sources=[str(src / name) for name in (*_KERNELS, _BINDING)],
                        extra_cflags=["-O3"],
                        # -Xptxas=-v: ptxas reports each kernel's registers, shared memory and spills;
                        # the report shows in the build log only with verbose=True (tools/gpu_check.py keeps it)
                        extra_cuda_cflags=["-O3", "-Xptxas=-v", f"-DPAGED_HEADERS={digest}"],
                        build_directory=str(folder),
                        verbose=verbose,
                    )
            except Exception as err:  # the compiler's output is in err
                raise RuntimeError(f"building the CUDA kernels of {src} failed: {err}") from err
    return _module


def available() -> bool:
    """True when a CUDA GPU is visible and the extension builds (or is built)."""
    if not torch.cuda.is_available():
        return False
    try:
        load()
    except RuntimeError:
        return False
    return True


def _require_cuda(**tensors: torch.Tensor) -> None:
    for name, t in tensors.items():
        if not t.is_cuda:
            raise ValueError(f"{name} must be a CUDA tensor for paged.kernels.cuda, got device {t.device}")


# --8<-- [start:api]
def paged_attention_v1(
    query: torch.Tensor,  # [S, H, D] one query token per sequence (decode), any strides
    key_cache: torch.Tensor,  # [N, B, H_kv, D] kv[l, 0]
    value_cache: torch.Tensor,  # [N, B, H_kv, D] kv[l, 1]
    block_tables: torch.Tensor,  # [S, M] int32 physical block of each logical block
    context_lens: torch.Tensor,  # [S] int32 tokens in the cache, the current one included
    scale: float,
    out: torch.Tensor | None = None,  # [S, H, D] written in place when given
) -> torch.Tensor:  # [S, H, D]
    """Decode attention, one thread block per (sequence, query head).

    Query head ``h`` reads KV head ``h // (H // H_kv)`` (grouped-query attention).
    A sequence with ``context_lens[s] == 0`` gets zeros. A strided query (a view
    of a fused QKV projection) is packed into a contiguous copy first.

    Raises:
        ValueError: a tensor is on the CPU, or a shape, layout or block size /
            head dim is not supported (the message lists the supported ones).
        TypeError: dtypes other than float32 / float16 / bfloat16, or mixed.
        RuntimeError: no GPU, or the build failed.
    """
    _require_cuda(query=query, key_cache=key_cache, value_cache=value_cache)
    return load().paged_attention_v1(query, key_cache, value_cache, block_tables, context_lens, float(scale), out)


def paged_attention_v2(
    query: torch.Tensor,  # [S, H, D]
    key_cache: torch.Tensor,  # [N, B, H_kv, D]
    value_cache: torch.Tensor,  # [N, B, H_kv, D]
    block_tables: torch.Tensor,  # [S, M] int32
    context_lens: torch.Tensor,  # [S] int32
    scale: float,
    out: torch.Tensor | None = None,  # [S, H, D]
    partition_size: int = 512,
) -> torch.Tensor:  # [S, H, D]
    """Decode attention with the context split into partitions of ``partition_size``
    tokens (a multiple of B), each attended by its own thread block, then reduced.

    Same result as v1 up to float32 reordering. Raises as ``paged_attention_v1``,
    and ``ValueError`` for a ``partition_size`` that is not a positive multiple of B.
    """
    _require_cuda(query=query, key_cache=key_cache, value_cache=value_cache)
    return load().paged_attention_v2(
        query, key_cache, value_cache, block_tables, context_lens, float(scale), out, int(partition_size)
    )


def write_kv(
    key_cache: torch.Tensor,  # [N, B, H_kv, D] written in place
    value_cache: torch.Tensor,  # [N, B, H_kv, D] written in place
    k: torch.Tensor,  # [T, H_kv, D] rows contiguous; tokens may be strided
    v: torch.Tensor,  # [T, H_kv, D]
    slot_mapping: torch.Tensor,  # [T] int64 slot of each token, negative: skip
) -> None:
    """Store each token's key and value at its slot (a bitwise copy)."""
    _require_cuda(key_cache=key_cache, value_cache=value_cache, k=k, v=v, slot_mapping=slot_mapping)
    load().write_kv(key_cache, value_cache, k, v, slot_mapping)


def copy_blocks(
    kv: torch.Tensor,  # [L, 2, N, B, H_kv, D] the whole cache, written in place
    pairs: torch.Tensor,  # [P, 2] int64 (src, dst) block ids
) -> None:
    """Copy block ``src`` to block ``dst`` for every pair, in every layer, keys and
    values, in one launch (a bitwise copy). CPU ``pairs`` are range-checked, then
    moved to the GPU."""
    _require_cuda(kv=kv)
    if not pairs.is_cuda:
        if pairs.numel() and (int(pairs.min()) < 0 or int(pairs.max()) >= kv.shape[2]):
            raise ValueError(f"block ids in pairs must lie in [0, {kv.shape[2]}), got {pairs.tolist()}")
        pairs = pairs.to(kv.device, non_blocking=True)
    load().copy_blocks(kv, pairs)
# --8<-- [end:api]


# --8<-- [start:select]
PARTITION_SIZE = 512  # tokens per v2 partition (the kernels' default)
FILLING_GRID = 512  # thread blocks of 128 threads that keep a large GPU's SMs busy (vLLM uses 512 too)
V1_MAX_CONTEXT = 8192  # past this, one thread block per head walks too long alone


def select_version(num_seqs: int, num_heads: int, max_context: int) -> str:
    """``"v1"`` or ``"v2"`` for a decode batch (vLLM's rule, with our partition size).

    v1 launches S * H thread blocks, each walking its whole context. It is the
    better choice when the context fits one partition (v2 would only add a
    reduce launch and a float32 round trip) or when S * H alone fills the GPU,
    up to contexts of ``V1_MAX_CONTEXT`` tokens. Otherwise v2 splits each context
    into partitions of ``PARTITION_SIZE`` tokens, so few long sequences still
    occupy every SM. ``max_context`` may be an upper bound (the block table's
    width times B): the host knows it without reading the device.
    """
    if max_context <= PARTITION_SIZE:
        return "v1"
    if num_seqs * num_heads >= FILLING_GRID and max_context <= V1_MAX_CONTEXT:
        return "v1"
    return "v2"


def decode_with(v1, v2, query, key_cache, value_cache, block_tables, context_lens, scale, out=None):
    """Call ``v1`` or ``v2`` as ``select_version`` says, bounding the context by the block
    table's width (M * B tokens) so that nothing is read back from the device."""
    max_context = block_tables.shape[1] * key_cache.shape[1]
    version = select_version(query.shape[0], query.shape[1], max_context)
    fn = v1 if version == "v1" else v2
    return fn(query, key_cache, value_cache, block_tables, context_lens, scale, out)
# --8<-- [end:select]


def paged_attention_decode(query, key_cache, value_cache, block_tables, context_lens, scale, out=None):
    """Decode attention by v1 or v2 (``select_version``); same arguments as ``paged_attention_v1``."""
    return decode_with(paged_attention_v1, paged_attention_v2, query, key_cache, value_cache, block_tables,
                       context_lens, scale, out)  # fmt: skip
