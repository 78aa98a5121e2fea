"""FlexAttention over a paged KV cache: the same block table, expressed as a block mask.

Not a benchmark itself (no ``run``): ``kernel_gpu`` times it beside our kernels.

FlexAttention (``torch.nn.attention.flex_attention``) attends a query to the
key blocks a ``BlockMask`` lists, in the order listed. Its paged form keeps
every physical block of every sequence in one tensor ``[1, H_kv, N * B, D]``
(flex's layout: token-major per head; ours is ``[N, B, H_kv, D]``, so the same
values are copied once into it) and gives sequence ``s`` the block indices of
its block-table row:

* a block the sequence fills (``B`` tokens) is a *full* block: attended whole,
  no per-token test;
* its last block, when partly filled, is a *partial* block: each key position
  goes through ``mask_mod``, which maps the physical position back to a logical
  one (``logical_of[s, physical block] * B + offset``) and keeps it when it is
  below the sequence's length.

Decode has one query token per sequence, so the mask has one row of query
blocks; its query block size is flex's default (128), of which one row is used.
The KV block size of the mask is ``B``. ``torch.compile`` turns flex into one
fused Triton kernel on a GPU; uncompiled (the CPU dry run) it runs a slow,
unfused reference that evaluates ``mask_mod`` everywhere, which is why
``mask_mod`` must be right for full blocks too.
"""

from __future__ import annotations

import functools
import warnings

import torch

Q_BLOCK_SIZE = 128  # flex's default query block; decode uses one row of it


def availability() -> str | None:
    """None when this torch has FlexAttention with block masks built from KV blocks, else why not."""
    try:
        from torch.nn.attention.flex_attention import BlockMask, flex_attention  # noqa: F401
    except ImportError as e:
        return f"torch {torch.__version__} has no FlexAttention ({e})"
    if not hasattr(BlockMask, "from_kv_blocks"):
        return f"torch {torch.__version__}'s BlockMask has no from_kv_blocks"
    return None


def flex_layout(cache: torch.Tensor) -> torch.Tensor:  # [N, B, H_kv, D] -> [1, H_kv, N * B, D]
    n, b, h_kv, d = cache.shape
    return cache.view(n * b, h_kv, d).transpose(0, 1).unsqueeze(0).contiguous()


def paged_block_mask(block_tables: torch.Tensor,  # [S, M] int32 physical block of each logical block
                     context_lens: torch.Tensor,  # [S] int32
                     block_size: int, num_blocks: int):
    """The ``BlockMask`` that attends sequence ``s`` to its first ``context_lens[s]`` tokens through its table.

    ``context_lens`` is read once here (on the host); the mask is for these lengths only.
    """
    from torch.nn.attention.flex_attention import BlockMask

    device = block_tables.device
    s, m = block_tables.shape
    lens = context_lens.to(torch.int64).cpu()
    used = (lens + block_size - 1) // block_size  # blocks holding tokens
    full = lens // block_size  # blocks holding B tokens
    logical_of = torch.full((s, num_blocks), -1, dtype=torch.int32, device=device)  # [S, N]
    kv_num = torch.zeros(s, 1, 1, dtype=torch.int32)
    kv_idx = torch.zeros(s, 1, 1, num_blocks, dtype=torch.int32)
    full_num = torch.zeros(s, 1, 1, dtype=torch.int32)
    full_idx = torch.zeros(s, 1, 1, num_blocks, dtype=torch.int32)
    tables = block_tables.to(torch.int32).cpu()
    for row in range(s):
        u, f = int(used[row]), int(full[row])
        logical_of[row, tables[row, :u].to(device)] = torch.arange(u, dtype=torch.int32, device=device)
        full_num[row, 0, 0], full_idx[row, 0, 0, :f] = f, tables[row, :f]
        kv_num[row, 0, 0], kv_idx[row, 0, 0, : u - f] = u - f, tables[row, f:u]
    lens_dev = context_lens.to(device=device, dtype=torch.int32)

    def mask_mod(b, h, q_idx, kv_idx):
        logical_block = logical_of[b, kv_idx // block_size]
        position = logical_block * block_size + kv_idx % block_size
        return (logical_block >= 0) & (position < lens_dev[b])

    return BlockMask.from_kv_blocks(
        kv_num.to(device), kv_idx.to(device), full_num.to(device), full_idx.to(device),
        BLOCK_SIZE=(Q_BLOCK_SIZE, block_size), mask_mod=mask_mod, seq_lengths=(1, num_blocks * block_size),
    )


@functools.cache
def _compiled_flex():
    """One compiled flex for every case: dynamo compiles a static graph, then (on the first new
    shape) a dynamic one that later shapes reuse; a new dtype or block size compiles again."""
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention)


def flex_decode(query: torch.Tensor,  # [S, H, D]
                key_cache: torch.Tensor,  # [N, B, H_kv, D]
                value_cache: torch.Tensor,  # [N, B, H_kv, D]
                block_tables: torch.Tensor,  # [S, M] int32
                context_lens: torch.Tensor,  # [S] int32
                scale: float, compiled: bool):
    """A callable computing decode attention ``[S, H, D]`` with FlexAttention, the mask and layout built once.

    ``compiled``: through ``torch.compile`` (a GPU's fused kernel; the first call compiles).
    """
    from torch.nn.attention.flex_attention import flex_attention

    n, b = key_cache.shape[:2]
    keys, values = flex_layout(key_cache), flex_layout(value_cache)  # [1, H_kv, N * B, D]
    mask = paged_block_mask(block_tables, context_lens, b, n)
    q = query.unsqueeze(2)  # [S, H, 1, D]
    if compiled:
        fn = _compiled_flex()
    else:  # the dry run: slow on purpose, and says so once per process; it is not timed against anything
        warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")
        fn = flex_attention
    gqa = query.shape[1] != key_cache.shape[2]
    return lambda: fn(q, keys, values, block_mask=mask, scale=scale, enable_gqa=gqa).squeeze(2)
