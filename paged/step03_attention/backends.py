"""Choosing an attention path (docs/architecture.md, attention paths).

Four paths compute the same thing with the same arguments (see
``reference.py``): ``reference`` and ``blockwise`` (pure PyTorch), ``cpu``
(the C++ / OpenMP kernel of ``csrc/cpu``) and ``cuda`` (``csrc/cuda``).
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


BACKENDS = ("reference", "blockwise", "cpu", "cuda")
ENV_VAR = "PAGED_ATTENTION_BACKEND"


def native_decode(name: str, fixed_split: bool = False):
    """The decode kernel of a native backend, or None (with one warning) if it cannot build.

    ``fixed_split``: the cpu kernel never splits a sequence into partitions (it does when
    the batch has too few sequences for the threads), so a query's reduction over blocks
    does not depend on the batch; cuda's v1 kernel never splits.
    """
    if name == "cpu":
        from paged.kernels import cpu as module
    else:
        from paged.kernels import cuda as module
    if module.available():
        if name != "cpu":
            return module.paged_attention_v1
        return functools.partial(module.paged_attention_decode, partition_blocks=0) if fixed_split \
            else module.paged_attention_decode
    return None


def native_write(name: str):
    """The C++ KV write of the ``cpu`` backend (a row copy per token, the same bits as
    ``KVCache.write``), or None: other backends write through ``KVCache.write``."""
    if name != "cpu":
        return None
    from paged.kernels import cpu

    return cpu.write_kv if cpu.available() else None


def resolve_backend(device: torch.device | str, requested: str | None = None) -> str:
    """The backend name to use on ``device``: ``requested``, the environment, or the fastest."""
    device = torch.device(device)
    name = requested or os.environ.get(ENV_VAR) or ("cuda" if device.type == "cuda" else "cpu")
    if name not in BACKENDS:
        raise ValueError(f"unknown attention backend {name!r}; choose one of {', '.join(BACKENDS)}")
    if name in ("cpu", "cuda") and name != device.type:
        raise ValueError(f"attention backend {name!r} cannot run on a {device.type} device")
    if name in ("cpu", "cuda") and native_decode(name) is None:
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
