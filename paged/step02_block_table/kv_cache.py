"""The paged KV cache: one tensor for every layer's blocks (paper §4.2–4.3; docs/architecture.md).

At start-up the engine allocates, once, a pool of ``N`` physical blocks for
every layer, keys and values together::

    data: [L, 2, N, B, H_kv, D]      # layer, key/value, block, offset, head, dim

A block id indexes dimension 2 in every layer at once, so copying or swapping
a block across all layers is one indexed copy (step04, step05). Layer ``l``
reads and writes ``data[l, 0]`` (keys) and ``data[l, 1]`` (values), each
``[N, B, H_kv, D]``; seen as ``[N * B, H_kv, D]`` token rows, row
``block * B + offset`` is the token's *slot* (``BlockTable.append``).

``write`` scatters new tokens to their slots; ``gather`` reads a sequence's
blocks back into a contiguous ``[T, H_kv, D]``. Both copy values and do no
arithmetic on them, so gather(write(x)) equals ``x`` bit for bit
(``tests/step02_block_table/test_kv_cache.py``).

Padding: a slot < 0 marks a padding token whose K/V must not be stored. So that
``write`` needs neither a Python loop nor a host synchronisation to find them,
the allocation holds one spare token row after ``data``; padding tokens are
routed there, and nothing ever reads it.

Extends: nothing in torch terms; it is the tensor side of step02, driven by
the slot mappings of ``BlockTable``.
"""

from __future__ import annotations

import functools

import math
import mmap

import torch


def zeros_on_demand(shape: tuple[int, ...], dtype: torch.dtype, device: str | torch.device) -> torch.Tensor:
    """A zero tensor whose CPU memory is taken page by page, as it is first written.

    ``torch.zeros`` writes every byte at once, so a 2 GiB pool is 2 GiB of
    resident memory from start-up however little of it the requests use. An
    anonymous memory mapping reads as zeros and the operating system backs a
    page only when it is first written. Other devices get ``torch.zeros``.
    """
    if torch.device(device).type != "cpu":
        return torch.zeros(shape, dtype=dtype, device=device)
    numel = math.prod(shape)
    buffer = mmap.mmap(-1, max(1, numel * dtype.itemsize))  # the tensor keeps it alive
    return torch.frombuffer(buffer, dtype=dtype, count=numel).view(shape)


def _check_positive(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    if value < 1:
        raise ValueError(f"{name} must be >= 1, got {value}")
    return value


class KVCache:
    """Every layer's K/V blocks in one allocation, with slot-mapped write and gather.

    Args:
        num_layers: ``L``, transformer layers.
        num_blocks: ``N``, physical blocks (from ``num_blocks_for`` and a byte budget).
        block_size: ``B``, tokens per block; must match the ``BlockTable``s.
        num_kv_heads: ``H_kv``, KV heads (this worker's share under tensor parallelism).
        head_dim: ``D``.
        dtype: element type of the cache (the model's dtype).
        device: where the pool lives.

    Attributes:
        data: ``[L, 2, N, B, H_kv, D]``, zero-initialised, contiguous; on a CPU its
            pages take memory only once written (``zeros_on_demand``).
    """

    # --8<-- [start:init]
    def __init__(
        self,
        num_layers: int,
        num_blocks: int,
        block_size: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype = torch.float32,
        device: str | torch.device = "cpu",
    ) -> None:
        for name, value in [("num_layers", num_layers), ("num_blocks", num_blocks),
                            ("block_size", block_size), ("num_kv_heads", num_kv_heads),
                            ("head_dim", head_dim)]:
            _check_positive(name, value)
        if not isinstance(dtype, torch.dtype):
            raise TypeError(f"dtype must be a torch.dtype, got {dtype!r}")
        self.num_layers, self.num_blocks, self.block_size = num_layers, num_blocks, block_size
        self.num_kv_heads, self.head_dim, self.dtype = num_kv_heads, head_dim, dtype
        rows = num_layers * 2 * num_blocks * block_size  # token rows of all layers
        # Zeros, not empty: an unwritten slot reads as 0, never as a NaN that a
        # masked softmax could turn into NaN output (0 * NaN = NaN).
        self._rows = zeros_on_demand((rows + 1, num_kv_heads, head_dim), dtype, device)
        self._spare_row = rows  # padding tokens (slot < 0) are written here
        self.data = self._rows[:rows].view(
            num_layers, 2, num_blocks, block_size, num_kv_heads, head_dim
        )  # [L, 2, N, B, H_kv, D]
        self.device = self.data.device

    # --8<-- [end:init]

    # -- views --------------------------------------------------------------
    def key(self, layer: int) -> torch.Tensor:
        """Keys of ``layer``: a view ``[N, B, H_kv, D]`` into ``data``."""
        return self._views[self._check_layer(layer)][0]

    def value(self, layer: int) -> torch.Tensor:
        """Values of ``layer``: a view ``[N, B, H_kv, D]`` into ``data``."""
        return self._views[self._check_layer(layer)][1]

    @functools.cached_property
    def _views(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """``(data[l, 0], data[l, 1])`` of every layer, made once: indexing ``data`` takes microseconds a
        call, and every layer's attention asks for its views at every forward pass (SmolLM2: 120 a step)."""
        return [(self.data[layer, 0], self.data[layer, 1]) for layer in range(self.num_layers)]

    @property
    def nbytes(self) -> int:
        """Bytes of the whole allocation (``data`` plus the one spare row)."""
        return self._rows.numel() * self._rows.element_size()

    # -- write and gather ---------------------------------------------------
    # --8<-- [start:write]
    def write(
        self,
        layer: int,
        k: torch.Tensor,  # [T, H_kv, D]
        v: torch.Tensor,  # [T, H_kv, D]
        slot_mapping: torch.Tensor,  # [T] int64, block * B + offset, < 0 = padding
    ) -> None:
        """Store the K/V of ``T`` new tokens of one layer at their slots.

        One ``index_copy_`` for keys and one for values, whatever the batch:
        no loop over tokens or sequences, and no host synchronisation (padding
        slots are redirected to the spare row, not filtered out).

        Args:
            layer: ``0 .. L - 1``.
            k: keys of the new tokens, ``[T, H_kv, D]``, the cache's dtype and device.
            v: values, same shape.
            slot_mapping: ``[T]`` int64; token ``t`` goes to slot ``slot_mapping[t]``;
                a negative slot skips the token (padding).

        Raises:
            IndexError: bad layer, or (checked on CPU only, where it is free) a
                slot >= ``N * B``.
            ValueError / TypeError: shapes, dtypes or devices that do not match.
        """
        self._check_layer(layer)
        self._check_kv("k", k, slot_mapping)
        self._check_kv("v", v, slot_mapping)
        num_slots = self.num_blocks * self.block_size
        if slot_mapping.device.type == "cpu" and slot_mapping.numel() > 0:
            if int(slot_mapping.max()) >= num_slots:
                raise IndexError(
                    f"slot {int(slot_mapping.max())} is outside the cache's "
                    f"{num_slots} slots (N={self.num_blocks} blocks of B={self.block_size})"
                )
        # --8<-- [start:write_rows]
        # Row of slot s in _rows: (layer * 2 + kv) * N * B + s. Out-of-range slots
        # (unchecked on an accelerator) go to the spare row too, never to a neighbour.
        valid = (slot_mapping >= 0) & (slot_mapping < num_slots)  # [T]
        key_base = layer * 2 * num_slots
        key_rows = torch.where(valid, slot_mapping + key_base, self._spare_row)  # [T]
        value_rows = torch.where(valid, slot_mapping + key_base + num_slots, self._spare_row)
        self._rows.index_copy_(0, key_rows, k)
        self._rows.index_copy_(0, value_rows, v)
        # --8<-- [end:write_rows]

    # --8<-- [end:write]

    # --8<-- [start:gather]
    def gather(
        self,
        layer: int,
        block_table: list[int] | torch.Tensor,  # [num_blocks_of_seq] physical ids
        num_tokens: int,
    ) -> tuple[torch.Tensor, torch.Tensor]:  # ([T, H_kv, D], [T, H_kv, D])
        """Read one sequence's first ``num_tokens`` keys and values back, contiguous.

        The blocks the tokens occupy are selected in logical order (one
        ``index_select`` for keys and values together), laid end to end and cut
        at ``num_tokens``: the reference path of step03's attention.

        Args:
            layer: ``0 .. L - 1``.
            block_table: physical block of each logical block (``BlockTable.blocks``).
            num_tokens: ``T``, at most ``len(block_table) * B``.

        Returns:
            ``(keys, values)``, each ``[T, H_kv, D]``, new contiguous tensors.

        Raises:
            IndexError: bad layer or block id.
            ValueError: ``num_tokens`` outside what the table holds.
        """
        self._check_layer(layer)
        blocks = self._block_ids(block_table)  # [num_blocks_of_seq]
        capacity = blocks.numel() * self.block_size
        if isinstance(num_tokens, bool) or not isinstance(num_tokens, int):
            raise TypeError(f"num_tokens must be an int, got {num_tokens!r}")
        if not 0 <= num_tokens <= capacity:
            raise ValueError(
                f"num_tokens={num_tokens} is outside 0..{capacity}: the block table "
                f"has {blocks.numel()} blocks of {self.block_size} tokens"
            )
        # --8<-- [start:gather_rows]
        used = -(-num_tokens // self.block_size)  # blocks holding the tokens
        kv = self.data[layer].index_select(1, blocks[:used])  # [2, used, B, H_kv, D]
        kv = kv.view(2, used * self.block_size, self.num_kv_heads, self.head_dim)
        return kv[0, :num_tokens], kv[1, :num_tokens]
        # --8<-- [end:gather_rows]

    # --8<-- [end:gather]

    # -- sizing -------------------------------------------------------------
    # --8<-- [start:sizing]
    @staticmethod
    def bytes_per_block(
        num_layers: int, block_size: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype
    ) -> int:
        """Bytes one physical block takes across all layers, keys and values."""
        return 2 * num_layers * block_size * num_kv_heads * head_dim * dtype.itemsize

    @staticmethod
    def num_blocks_for(
        memory_bytes: int,
        num_layers: int,
        block_size: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
    ) -> int:
        """How many blocks fit in ``memory_bytes``, the allocation's spare row included.

        Args:
            memory_bytes: the budget (an int, or a float such as ``4e9``).
            num_layers: ``L``.
            block_size: ``B``.
            num_kv_heads: ``H_kv``.
            head_dim: ``D``.
            dtype: element type of the cache.

        Raises:
            TypeError: ``memory_bytes`` is not a number.
            ValueError: the budget does not hold even one block, or is not finite.
        """
        if isinstance(memory_bytes, bool) or not isinstance(memory_bytes, (int, float)):
            raise TypeError(f"memory_bytes must be a number of bytes, got {memory_bytes!r}")
        if memory_bytes != memory_bytes or memory_bytes in (float("inf"), float("-inf")):
            raise ValueError(f"memory_bytes must be finite, got {memory_bytes}")
        memory_bytes = int(memory_bytes)  # 4e9 from a command line is a fine budget
        per_block = KVCache.bytes_per_block(num_layers, block_size, num_kv_heads, head_dim, dtype)
        spare = num_kv_heads * head_dim * dtype.itemsize  # the padding row of write()
        num_blocks = (memory_bytes - spare) // per_block
        if num_blocks < 1:
            raise ValueError(
                f"a KV cache budget of {memory_bytes} bytes holds no block: one block "
                f"takes {per_block} bytes (2 x L={num_layers} x B={block_size} x "
                f"H_kv={num_kv_heads} x D={head_dim} x {dtype.itemsize} bytes) "
                f"plus {spare} bytes once for padding"
            )
        return num_blocks

    # --8<-- [end:sizing]

    # -- checks -------------------------------------------------------------
    def _check_layer(self, layer: int) -> int:
        if isinstance(layer, bool) or not isinstance(layer, int):
            raise TypeError(f"layer must be an int, got {layer!r}")
        if not 0 <= layer < self.num_layers:
            raise IndexError(f"layer {layer} is outside 0..{self.num_layers - 1}")
        return layer

    def _check_kv(self, name: str, x: torch.Tensor, slot_mapping: torch.Tensor) -> None:
        if not isinstance(slot_mapping, torch.Tensor) or slot_mapping.dtype != torch.int64:
            got = slot_mapping.dtype if isinstance(slot_mapping, torch.Tensor) else type(slot_mapping)
            raise TypeError(f"slot_mapping must be an int64 tensor, got {got}")
        if slot_mapping.dim() != 1:
            raise ValueError(f"slot_mapping must be 1-D [T], got shape {tuple(slot_mapping.shape)}")
        expected = (slot_mapping.shape[0], self.num_kv_heads, self.head_dim)
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{name} must be a tensor, got {type(x).__name__}")
        if tuple(x.shape) != expected:
            raise ValueError(
                f"{name} has shape {tuple(x.shape)}, expected [T, H_kv, D] = {expected}"
            )
        if x.dtype != self.dtype:
            raise TypeError(f"{name} has dtype {x.dtype}, the cache holds {self.dtype}")
        if x.device != self.device or slot_mapping.device != self.device:
            raise ValueError(
                f"{name} is on {x.device} and slot_mapping on {slot_mapping.device}, "
                f"the cache is on {self.device}"
            )

    def _block_ids(self, block_table: list[int] | torch.Tensor) -> torch.Tensor:
        if isinstance(block_table, torch.Tensor):
            if block_table.dim() != 1 or block_table.dtype != torch.int64:
                raise TypeError(
                    f"a block table tensor must be 1-D int64, got {block_table.dtype} "
                    f"of shape {tuple(block_table.shape)}"
                )
            if block_table.device.type == "cpu" and block_table.numel() > 0:
                self._check_ids(int(block_table.min()), int(block_table.max()))
            return block_table.to(self.device)
        ids = list(block_table)
        if any(isinstance(b, bool) or not isinstance(b, int) for b in ids):
            raise TypeError(f"block ids must be ints, got {ids!r}")
        if ids:
            self._check_ids(min(ids), max(ids))
        return torch.tensor(ids, dtype=torch.int64, device=self.device)

    def _check_ids(self, lo: int, hi: int) -> None:
        bad = lo if lo < 0 else hi
        if lo < 0 or hi >= self.num_blocks:
            raise IndexError(f"block id {bad} is outside 0..{self.num_blocks - 1}")

    def __repr__(self) -> str:
        return (
            f"KVCache(L={self.num_layers}, N={self.num_blocks}, B={self.block_size}, "
            f"H_kv={self.num_kv_heads}, D={self.head_dim}, dtype={self.dtype}, "
            f"device={self.device})"
        )
