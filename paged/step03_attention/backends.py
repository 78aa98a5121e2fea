"""Choosing an attention path (docs/architecture.md, attention paths).

Four paths compute the same thing with the same arguments (see
``reference.py``): ``reference`` and ``blockwise`` (pure PyTorch), ``cpu``
(the C++ / OpenMP kernel of ``csrc/cpu``) and ``cuda`` (``csrc/cuda``).
``emulated-cuda`` runs the ``cuda`` path's kernels on the CPU through their
device-emulation build (``paged.kernels.cuda_emulated``): slow, for tests and
for reading the CUDA path without a GPU. Only it is never picked by default.
On ``cuda`` and ``emulated-cuda`` every kernel is used: decode attention v1 or
v2 (``paged.kernels.cuda.select_version``), the fused KV write and the fused
block copy (copy-on-write, via ``native_copy``).
``PAGED_ATTENTION_BACKEND`` forces one; otherwise the fastest available for
the tensors' device is used. The native kernels handle decode (one new token
per sequence); prompts go through ``prefill_attention``, which needs no gather
when nothing of the sequence is cached yet.
"""

from __future__ import annotations

import functools
import os
import warnings

import torch
import torch.nn.functional as F


BACKENDS = ("reference", "blockwise", "cpu", "cuda", "emulated-cuda")
NATIVE = ("cpu", "cuda", "emulated-cuda")
_DEVICE = {"cpu": "cpu", "cuda": "cuda", "emulated-cuda": "cpu"}  # where each native backend's tensors live
ENV_VAR = "PAGED_ATTENTION_BACKEND"


def _kernels(name: str):
    """The kernel module of a native backend, or None if it is not one or cannot build."""
    if name == "cpu":
        from paged.kernels import cpu as module
    elif name == "cuda":
        from paged.kernels import cuda as module
    elif name == "emulated-cuda":
        from paged.kernels import cuda_emulated as module
    else:
        return None
    return module if module.available() else None


def native_decode(name: str, fixed_split: bool = False):
    """The decode kernel of a native backend (on ``cuda`` / ``emulated-cuda``: v1 or v2
    by shape), or None if it cannot build.

    ``fixed_split``: a query's reduction over blocks must not depend on the batch.
    The cpu kernel then never splits a sequence into partitions (it does when the
    batch has too few sequences for the threads); on ``cuda`` / ``emulated-cuda``
    it is always v1 (the v1 / v2 choice depends on the number of sequences).
    """
    module = _kernels(name)
    if module is None:
        return None
    if not fixed_split:
        return module.paged_attention_decode
    if name == "cpu":
        return functools.partial(module.paged_attention_decode, partition_blocks=0)
    return module.paged_attention_v1


def native_write(name: str):
    """The native fused KV write (a row copy per token, the same bits as
    ``KVCache.write``), or None: other backends write through ``KVCache.write``."""
    module = _kernels(name)
    return None if module is None else module.write_kv


def native_copy(name: str):
    """The fused block copy ``copy_blocks(kv [L, 2, N, B, H_kv, D], pairs [P, 2])`` of the
    ``cuda`` and ``emulated-cuda`` backends, or None: the others copy by indexing."""
    module = _kernels(name) if name in ("cuda", "emulated-cuda") else None
    return None if module is None else module.copy_blocks


def resolve_backend(device: torch.device | str, requested: str | None = None) -> str:
    """The backend name to use on ``device``: ``requested``, the environment, or the fastest."""
    device = torch.device(device)
    name = requested or os.environ.get(ENV_VAR) or ("cuda" if device.type == "cuda" else "cpu")
    if name not in BACKENDS:
        raise ValueError(f"unknown attention backend {name!r}; choose one of {', '.join(BACKENDS)}")
    if name in NATIVE and _DEVICE[name] != device.type:
        raise ValueError(f"attention backend {name!r} cannot run on a {device.type} device")
    if name == "emulated-cuda":  # asked for by name, to test the CUDA path: never a fallback
        from paged.kernels import cuda_emulated

        cuda_emulated.load()  # RuntimeError (no compiler, failed build) with the reason
    elif name in NATIVE and native_decode(name) is None:
        warnings.warn(f"the {name} attention kernel is unavailable; using 'reference' instead")
        return "reference"
    return name


def prefill_attention(
    q: torch.Tensor,  # [T, H, D] all tokens of a sequence with nothing cached before them
    k: torch.Tensor,  # [T, H_kv, D]
    v: torch.Tensor,  # [T, H_kv, D]
    scale: float,
) -> torch.Tensor:  # [T, H, D]
    """Causal attention over a prompt's own keys: no block table needed yet.

    The inputs get a batch dimension of 1: SDPA's fused CPU kernel (flash
    attention, grouped-query heads included) takes only 4-D tensors, and 3-D
    ones fall back to its unfused math path, about twice as slow.
    """
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None],
        is_causal=True, scale=scale, enable_gqa=q.shape[1] != k.shape[1],
    )  # [1, H, T, D]
    return out[0].transpose(0, 1)
