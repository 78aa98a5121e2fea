"""The CUDA kernels of ``csrc/cuda`` run on the CPU: the device-emulation build.

The same ``.cu`` files as ``paged.kernels.cuda``, compiled by the host C++
compiler with ``PAGED_CUDA_EMULATION`` (``csrc/cuda/emulation/emulation.h``
stands in for CUDA's headers): a launch runs its grid thread block by thread
block, and the threads of a thread block run as fibers that meet at
``__syncthreads`` and at every warp shuffle, with CUDA's lane and mask rules. A
barrier that cannot complete fails the call with a ``RuntimeError`` saying which
threads wait where; nothing hangs. It is slow (a context switch per thread per
shuffle): it exists to test and to step through the kernels without a GPU.

The four operations take CPU tensors and otherwise behave exactly as
``paged.kernels.cuda``'s (the same ``binding.cpp`` checks them, with the same
messages); ``trace`` records which logical blocks each warp attends.

The extension is compiled on first use with ``torch.utils.cpp_extension.load``
(a minute or two) into ``$PAGED_EXTENSIONS_DIR`` (default
``~/.cache/paged/torch_extensions``), in a folder named after the torch version
and a hash of ``csrc/cuda``, so an edited kernel builds afresh and never loads a
stale library. It needs only a C++17 compiler, no CUDA toolkit and no GPU;
without a compiler ``load()`` raises ``RuntimeError`` and ``available()`` is
False (the tests then skip, saying why; there is no fallback).
``PAGED_EMULATION_THREADS`` caps the CPU threads that run thread blocks
(default: all cores).
"""

from __future__ import annotations

import os
import shutil
import threading
from contextlib import contextmanager
from pathlib import Path

import torch

from paged.kernels.build_cache import build_dir, build_lock, place_key, source_key
from paged.kernels.cuda import decode_with, source_dir

__all__ = ["available", "copy_blocks", "load", "paged_attention_decode", "paged_attention_v1", "paged_attention_v2",
           "trace", "write_kv"]  # fmt: skip

_SOURCES = ("emulation/paged_attention_v1.cpp", "emulation/paged_attention_v2.cpp", "emulation/cache_ops.cpp",
            "emulation/runtime.cpp", "binding.cpp")  # fmt: skip
# -ffp-contract=off: every product rounded where the source says (no fused multiply-add),
# so a run is the same on every CPU; -fno-strict-aliasing: the kernels read half words
# through wider integer types, as CUDA code does.
_FLAGS = ["-O2", "-DPAGED_CUDA_EMULATION", "-ffp-contract=off", "-fno-strict-aliasing",
          "-Wno-unknown-pragmas"]  # fmt: skip
_lock = threading.Lock()
_module = None
_error: Exception | None = None


def _build_dir(src: Path) -> Path:
    return build_dir("paged_cuda_emulated", f"src{source_key(src)}", f"at{place_key(src)}")


def load(verbose: bool = False):
    """The compiled emulation, building it on the first call.

    Raises:
        RuntimeError: no C++ compiler, or the build failed (the compiler's
            output is chained as the cause). Later calls raise it again at once.
    """
    global _module, _error
    if _module is not None:
        return _module
    with _lock:
        if _module is None:
            if _error is not None:
                raise _error
            cxx = os.environ.get("CXX", "c++")
            if shutil.which(cxx) is None:
                _error = RuntimeError(f"the CUDA device emulation needs a C++ compiler: {cxx!r} is not on PATH")
                raise _error
            from torch.utils import cpp_extension

            src = source_dir()
            try:
                folder = _build_dir(src)
                with build_lock(folder, "paged_cuda_emulated.so"):
                    _module = cpp_extension.load(
                        name="paged_cuda_emulated",
                        sources=[str(src / name) for name in _SOURCES],
                        extra_cflags=_FLAGS,
                        build_directory=str(folder),
                        verbose=verbose,
                    )
            except Exception as err:  # the compiler's output is in err
                _error = RuntimeError(f"building the CUDA device emulation of {src} failed: {err}")
                raise _error from err
    return _module


def available() -> bool:
    """True when the emulation is built or builds here."""
    try:
        load()
    except RuntimeError:
        return False
    return True


def _require_cpu(**tensors: torch.Tensor) -> None:
    for name, t in tensors.items():
        if t.device.type != "cpu":
            raise ValueError(f"{name} must be a CPU tensor for the CUDA device emulation, got device {t.device}")


def paged_attention_v1(query, key_cache, value_cache, block_tables, context_lens, scale, out=None):
    """``paged.kernels.cuda.paged_attention_v1`` on CPU tensors (same arguments and shapes)."""
    _require_cpu(query=query, key_cache=key_cache, value_cache=value_cache)
    return load().paged_attention_v1(query, key_cache, value_cache, block_tables, context_lens, float(scale), out)


def paged_attention_v2(query, key_cache, value_cache, block_tables, context_lens, scale, out=None,
                       partition_size: int = 512):  # fmt: skip
    """``paged.kernels.cuda.paged_attention_v2`` on CPU tensors."""
    _require_cpu(query=query, key_cache=key_cache, value_cache=value_cache)
    return load().paged_attention_v2(
        query, key_cache, value_cache, block_tables, context_lens, float(scale), out, int(partition_size)
    )


def paged_attention_decode(query, key_cache, value_cache, block_tables, context_lens, scale, out=None):
    """v1 or v2 as on a GPU (``paged.kernels.cuda.select_version``), on CPU tensors."""
    return decode_with(paged_attention_v1, paged_attention_v2, query, key_cache, value_cache, block_tables,
                       context_lens, scale, out)  # fmt: skip


def write_kv(key_cache, value_cache, k, v, slot_mapping) -> None:
    """``paged.kernels.cuda.write_kv`` on CPU tensors."""
    _require_cpu(key_cache=key_cache, value_cache=value_cache, k=k, v=v, slot_mapping=slot_mapping)
    load().write_kv(key_cache, value_cache, k, v, slot_mapping)


def copy_blocks(kv, pairs) -> None:
    """``paged.kernels.cuda.copy_blocks`` on CPU tensors (``pairs`` range-checked first)."""
    _require_cpu(kv=kv, pairs=pairs)
    if pairs.numel() and (int(pairs.min()) < 0 or int(pairs.max()) >= kv.shape[2]):
        raise ValueError(f"block ids in pairs must lie in [0, {kv.shape[2]}), got {pairs.tolist()}")
    load().copy_blocks(kv, pairs)


@contextmanager
def trace():
    """Record, for the attention launches inside the ``with``, which logical KV
    blocks each warp of each thread block attends (launches run on one CPU thread
    meanwhile). Yields a list, filled on exit with one dict per visit:
    ``{"head", "seq", "partition", "warp", "logical", "physical"}`` (the thread
    block's ``blockIdx.x / .y / .z``, the warp, the block-table column and entry)."""
    module = load()
    visits: list[dict] = []
    module.trace_start()
    try:
        yield visits
    finally:
        keys = ("head", "seq", "partition", "warp", "logical", "physical")
        visits.extend(dict(zip(keys, row)) for row in module.trace_stop())


def warp_table(visits: list[dict]) -> list[str]:
    """One line per thread block: for each warp, the logical blocks it attended
    (``logical->physical``), in the order it attended them."""
    rows: dict[tuple, dict[int, list[str]]] = {}
    for v in visits:
        key = (v["head"], v["seq"], v["partition"])
        rows.setdefault(key, {}).setdefault(v["warp"], []).append(f"{v['logical']}->{v['physical']}")
    warps = 1 + max((v["warp"] for v in visits), default=0)
    lines = ["thread block (head, seq, partition) | " + " | ".join(f"warp {w}" for w in range(warps))]
    for key in sorted(rows, key=lambda k: (k[1], k[0], k[2])):
        lines.append(f"{key!s:<35} | " + " | ".join(" ".join(rows[key].get(w, [])) or "-" for w in range(warps)))
    return lines


def main(argv=None) -> None:
    """Run one decode launch of v1 or v2 on the CPU and print which warp read which block."""
    import argparse

    p = argparse.ArgumentParser(prog="python -m paged.kernels.cuda_emulated", description=main.__doc__)
    p.add_argument("--version", choices=["v1", "v2"], default="v2")
    p.add_argument("--context", type=int, nargs="+", default=[100], help="context length of each sequence")
    p.add_argument("--block-size", type=int, default=8, choices=[8, 16, 32])
    p.add_argument("--partition-size", type=int, default=32, help="v2: tokens per partition (a multiple of B)")
    p.add_argument("--heads", type=int, default=2)
    p.add_argument("--kv-heads", type=int, default=1)
    p.add_argument("--head-dim", type=int, default=64, choices=[32, 64, 80, 96, 128])
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    b, gen = args.block_size, torch.Generator().manual_seed(args.seed)
    need = [-(-n // b) for n in args.context]
    num_blocks = sum(need)
    order = torch.randperm(num_blocks, generator=gen).tolist()  # physical blocks in no particular order
    tables = torch.zeros(len(need), max(need), dtype=torch.int32)
    for s, k in enumerate(need):
        tables[s, :k] = torch.tensor(order[sum(need[:s]) : sum(need[:s]) + k])
    cache = (num_blocks, b, args.kv_heads, args.head_dim)
    key_cache, value_cache = torch.randn(cache, generator=gen), torch.randn(cache, generator=gen)
    query = torch.randn(len(need), args.heads, args.head_dim, generator=gen)
    lens = torch.tensor(args.context, dtype=torch.int32)
    with trace() as visits:
        if args.version == "v1":
            paged_attention_v1(query, key_cache, value_cache, tables, lens, args.head_dim**-0.5)
        else:
            paged_attention_v2(query, key_cache, value_cache, tables, lens, args.head_dim**-0.5,
                               partition_size=args.partition_size)  # fmt: skip
    part = f", partitions of {args.partition_size} tokens" if args.version == "v2" else ""
    print(f"paged attention {args.version} (CUDA device emulation): contexts {args.context}, B = {b}{part}, "
          f"{args.heads} query / {args.kv_heads} KV heads, D = {args.head_dim}, 4 warps per thread block")  # fmt: skip
    print("\n".join(warp_table(visits)))


if __name__ == "__main__":
    main()
