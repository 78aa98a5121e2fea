"""Choosing an attention path: the seam where the fast kernels enter (docs/architecture.md, attention paths).

Four paths compute the same thing with the same arguments (see
``reference.py``): ``reference`` and ``blockwise`` (pure PyTorch), ``cpu``
(the C++ / OpenMP kernels of ``csrc/cpu``) and ``cuda`` (``csrc/cuda``).
``emulated-cuda`` runs the ``cuda`` path's kernels on the CPU through their
device-emulation build (``paged.kernels.cuda_emulated``): slow, for tests and
for reading the CUDA path without a GPU. Only it is never picked by default.
On ``cuda`` and ``emulated-cuda`` every kernel is used: decode attention v1 or
v2 (``paged.kernels.cuda.select_version``), the fused KV write and the fused
block copy (copy-on-write, via ``native_copy``).
``PAGED_ATTENTION_BACKEND`` forces one; otherwise the fastest available for
the tensors' device is used.

``attention_path(name, batch_invariant)`` is what ``PagedAttention`` calls for
every layer: each sequence's new queries over its blocks, causally. How a
backend keeps a token's result independent of the batch (batch-invariant mode,
docs/architecture.md) is its own business, decided here:

* ``cpu``: the prefill kernel for every batch with a prompt in it, the decode
  kernel (never split into partitions) for all-decode batches; the prefill
  kernel gives each token the decode kernel's bits, so one path it is.
* ``reference``, ``blockwise``, ``cuda``, ``emulated-cuda``: every new token
  as a query of its own, over its sequence's table and the context it sees
  (``AttentionMetadata.per_token``), through the one-query-per-row path (the
  CUDA v1 kernel, whose choice does not depend on the batch).

Without the mode each takes its fastest route: the native kernels decode
(the cpu one split into partitions when the batch is small), a prompt with
nothing cached goes through ``prefill_attention`` (SDPA's fused kernel), one
over a cached prefix (a chunk of a long prompt, a tail after a prefix-cache
hit) through the cpu prefill kernel on ``cpu``, the reference path elsewhere.

Sliding windows and soft-capped scores (the keywords ``window`` and
``softcap`` of the models' attention call) reach every path: the PyTorch
paths mask and cap (``reference``, ``blockwise``); the cpu kernels start a
query's block loop at its window and cap each score, and on the cpu backend a
batch with a prompt in a layer that has either goes through the prefill kernel
in both modes (SDPA's fused kernel has neither; the prefill kernel reads only
the window's blocks). The CUDA kernels have neither yet: on ``cuda`` and
``emulated-cuda`` such a layer runs the reference path (``_reference_for_options``
says so once).
"""

from __future__ import annotations

import functools
import os
import warnings
from typing import Callable

import torch
import torch.nn.functional as F

from paged.step03_attention.blockwise import blockwise_attention
from paged.step03_attention.reference import gather_blocks, reference_attention


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


def native_decode(name: str):
    """The decode kernel of a native backend (on ``cuda`` / ``emulated-cuda``: v1 or v2
    by shape), or None if it cannot build."""
    module = _kernels(name)
    return None if module is None else module.paged_attention_decode


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


def kv_writer(name: str, kv_cache) -> Callable:
    """``write(layer, k [T, H_kv, D], v, slot_mapping [T])``: the backend's fused KV write
    (``native_write``) or ``KVCache.write``; the same bits either way."""
    native = native_write(name) if name in NATIVE else None
    if native is None:
        return kv_cache.write
    return lambda layer, k, v, slots: native(kv_cache.key(layer), kv_cache.value(layer), k, v, slots)


def attention_path(name: str, batch_invariant: bool) -> Callable:
    """``attend(query [T, H, D], key_cache [N, B, H_kv, D], value_cache, meta, scale, window=None,
    softcap=None) -> [T, H, D]`` for backend ``name``: the new queries of every sequence in ``meta``
    (an ``AttentionMetadata``) over its blocks, causally, within a sliding ``window`` and with
    soft-capped scores when given. With ``batch_invariant`` a token's result does not depend on
    the rest of the batch (see the module doc)."""
    module = _kernels(name) if name in NATIVE else None
    if name in ("reference", "blockwise") or module is None:
        fn = blockwise_attention if name == "blockwise" else reference_attention
        if batch_invariant:
            return lambda q, kc, vc, m, scale, window=None, softcap=None: fn(
                q, kc, vc, *m.per_token, None, scale, window, softcap)
        return lambda q, kc, vc, m, scale, window=None, softcap=None: fn(
            q, kc, vc, m.block_tables, m.context_lens, None if m.all_decode else m.query_lens, scale, window, softcap)
    if name == "cpu":
        return _cpu_path(module, batch_invariant)
    # cuda, emulated-cuda
    if batch_invariant:  # v1, one query per row
        fast = lambda q, kc, vc, m, scale: module.paged_attention_v1(q, kc, vc, *m.per_token, scale)  # noqa: E731
    else:
        fast = functools.partial(_fastest, module.paged_attention_decode)
    return _reference_for_options(name, fast, attention_path("reference", batch_invariant))


def _cpu_path(module, batch_invariant: bool) -> Callable:
    """The cpu backend: all-decode batches through the decode kernel (never split into partitions
    in batch-invariant mode), batches with a prompt through the prefill kernel in that mode or
    when the layer has a window or a soft-cap, else by ``_fastest`` (its prompts over a cached prefix
    through the prefill kernel too)."""
    decode = functools.partial(module.paged_attention_decode, partition_blocks=0 if batch_invariant else -1)

    def attend(q, kc, vc, m, scale, window=None, softcap=None):
        if m.all_decode:
            return decode(q, kc, vc, m.block_tables, m.context_lens, scale, window=window, softcap=softcap)
        if batch_invariant or window is not None or softcap is not None:
            return module.paged_attention_prefill(q, kc, vc, m.block_tables, m.context_lens, m.query_lens_tensor,
                                                  scale, window=window, softcap=softcap)
        return _fastest(decode, q, kc, vc, m, scale, prefill=module.paged_attention_prefill)
    return attend


_ROUTED: set[str] = set()  # the backends whose windowed / soft-capped layers went to the reference path


def _reference_for_options(name: str, fast: Callable, reference: Callable) -> Callable:
    """``fast`` for the layers without a window or a soft-cap, ``reference`` for those with one:
    csrc/cuda masks no window and caps no score yet. Warns the first time it happens in a process."""

    def attend(q, kc, vc, m, scale, window=None, softcap=None):
        if window is None and softcap is None:
            return fast(q, kc, vc, m, scale)
        if name not in _ROUTED:
            _ROUTED.add(name)
            warnings.warn(f"the {name} attention kernels have no sliding window or soft-capping yet: layers "
                          "with one run the reference path (gather, then SDPA)", stacklevel=2)
        return reference(q, kc, vc, m, scale, window, softcap)
    return attend


def _fastest(decode, q, key_cache, value_cache, m, scale, prefill=None):
    """Decode rows through the native kernel; a prompt with nothing cached through SDPA's
    fused kernel over its own keys; one over a cached prefix through ``prefill`` (the backend's
    kernel for many queries over paged K/V, where it has one) or else the reference path, which
    gathers the whole context, repeats it for the query heads and masks it (the slower:
    docs/benchmarks.md, "long prompts")."""
    if m.all_decode:
        return decode(q, key_cache, value_cache, m.block_tables, m.context_lens, scale)
    out = torch.empty_like(q)
    for s, start, q_len, ctx in m.prompts:
        rows = slice(start, start + q_len)
        if q_len == ctx:  # nothing cached before this prompt: attend over its own K/V
            k = gather_blocks(key_cache, m.block_tables[s], ctx)  # [ctx, H_kv, D]
            v = gather_blocks(value_cache, m.block_tables[s], ctx)
            out[rows] = prefill_attention(q[rows], k, v, scale)
        elif prefill is not None:  # a cached prefix (step04), a chunk or a recomputation (step05)
            out[rows] = prefill(q[rows], key_cache, value_cache, m.block_tables[s : s + 1],
                                m.context_lens[s : s + 1], m.query_lens_tensor[s : s + 1], scale)
        else:
            out[rows] = reference_attention(
                q[rows], key_cache, value_cache, m.block_tables[s : s + 1], m.context_lens[s : s + 1], [q_len], scale
            )
    if m.decode_seqs is not None:
        rows = m.decode_rows
        out[rows] = decode(q[rows], key_cache, value_cache, m.block_tables[m.decode_seqs],
                           m.context_lens[m.decode_seqs], scale)
    return out
