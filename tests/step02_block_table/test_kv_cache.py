"""KVCache: write through slot mappings, gather back, sizing (paper §4.2–4.3; docs/architecture.md, KV cache).

The central property (the shadow contiguous model of docs/architecture.md): several
interleaved sequences with random lengths write their K/V through
``BlockTable.append`` + ``KVCache.write`` — token by token, in prefill chunks,
and batched with padding — over a shuffled free list, and ``gather`` returns
each sequence's contiguous K/V **bitwise** (``torch.equal``): write and gather
only copy values, no arithmetic touches them, so nothing short of equality is
acceptable. Dtypes include float16 and bfloat16 for the same reason.
"""

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, consumes, invariant, rule

from paged.step01_allocator import BlockAllocator, OutOfBlocksError
from paged.step02_block_table import BlockTable, KVCache
from tests.invariants import check_allocator
from tests.strategies import block_sizes, seq_lens, shuffled_free_list

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]


def random_kv(gen: torch.Generator, t: int, h_kv: int, d: int, dtype, num_layers: int):
    """Per-layer (k, v), each ``[T, H_kv, D]``, distinct random values."""
    return [
        (torch.randn(t, h_kv, d, generator=gen).to(dtype), torch.randn(t, h_kv, d, generator=gen).to(dtype))
        for _ in range(num_layers)
    ]


# -- the stateful machine: the shadow contiguous model -------------------------
class PagedKVMachine(RuleBasedStateMachine):
    """Interleaved sequences, one shared allocator and KVCache, a shadow K/V per sequence."""

    seqs = Bundle("seqs")

    def __init__(self):
        super().__init__()
        self.cache = None
        self.live: list[BlockTable] = []
        self.shadow: dict[int, list] = {}  # id(table) -> per layer [k list, v list]

    def _setup(self, data):
        self.block_size = b = data.draw(block_sizes, label="B")
        num_blocks = data.draw(st.integers(1, 16), label="N")
        self.h_kv = data.draw(st.sampled_from([1, 2]), label="H_kv")
        self.d = data.draw(st.sampled_from([1, 4, 8]), label="D")
        self.dtype = data.draw(st.sampled_from(DTYPES), label="dtype")
        self.num_layers = data.draw(st.integers(1, 2), label="L")
        order = data.draw(shuffled_free_list(num_blocks))
        self.allocator = BlockAllocator(num_blocks, free_order=order)
        self.cache = KVCache(self.num_layers, num_blocks, b, self.h_kv, self.d, self.dtype)
        self.gen = torch.Generator().manual_seed(data.draw(st.integers(0, 2**31), label="seed"))

    @rule(target=seqs, data=st.data())
    def new_sequence(self, data):
        if self.cache is None:
            self._setup(data)
        table = BlockTable(self.allocator, self.block_size)
        self.live.append(table)
        self.shadow[id(table)] = [[[], []] for _ in range(self.num_layers)]
        return table

    def _reserve(self, table, n):
        """append(n) or, out of blocks, check nothing changed and return None."""
        if table.slots_for(n) > self.allocator.num_free:
            blocks, tokens, free = list(table.blocks), table.num_tokens, self.allocator.free_blocks()
            data_before = self.cache.data.clone()
            with pytest.raises(OutOfBlocksError):
                table.append(n)
            assert (table.blocks, table.num_tokens) == (blocks, tokens)
            assert self.allocator.free_blocks() == free
            assert torch.equal(self.cache.data, data_before)
            return None
        return table.append(n)

    def _remember(self, table, kv):
        for layer, (k, v) in enumerate(kv):
            self.shadow[id(table)][layer][0].append(k)
            self.shadow[id(table)][layer][1].append(v)

    @rule(table=seqs, data=st.data(), token_by_token=st.booleans())
    def write_one_sequence(self, table, data, token_by_token):
        """A prefill chunk in one write, or the same tokens one decode step at a time."""
        if table not in self.live:
            return
        n = data.draw(seq_lens(self.block_size, max_blocks=3), label="n")
        for chunk in ([1] * n if token_by_token else [n]):
            slots = self._reserve(table, chunk)
            if slots is None:
                return
            kv = random_kv(self.gen, chunk, self.h_kv, self.d, self.dtype, self.num_layers)
            for layer, (k, v) in enumerate(kv):
                self.cache.write(layer, k, v, torch.tensor(slots, dtype=torch.int64))
            self._remember(table, kv)

    @rule(data=st.data())
    def write_batch_with_padding(self, data):
        """One write per layer for several sequences at once, padding slots (-1) mixed in."""
        if not self.live:
            return
        chosen = data.draw(st.lists(st.sampled_from(self.live), min_size=1, max_size=3, unique_by=id))
        slots, parts = [], []
        for table in chosen:
            n = data.draw(st.integers(0, 2 * self.block_size), label="n")
            got = self._reserve(table, n)
            if got is None:
                continue
            kv = random_kv(self.gen, n, self.h_kv, self.d, self.dtype, self.num_layers)
            pad = data.draw(st.integers(0, 2), label="pad")
            slots += got + [-1] * pad
            parts.append((table, kv, n, pad))
        before = self.cache.data.clone()
        for layer in range(self.num_layers):
            ks, vs = [], []
            for _, kv, n, pad in parts:
                garbage = torch.full((pad, self.h_kv, self.d), 7.0, dtype=self.dtype)
                ks += [kv[layer][0], garbage]
                vs += [kv[layer][1], garbage]
            empty = torch.empty(0, self.h_kv, self.d, dtype=self.dtype)
            self.cache.write(layer, torch.cat(ks or [empty]), torch.cat(vs or [empty]),
                             torch.tensor(slots, dtype=torch.int64))
        for table, kv, _, _ in parts:
            self._remember(table, kv)
        # Only the valid slots changed; padding wrote nowhere in data.
        written = [s for s in slots if s >= 0]
        mask = torch.ones(self.cache.num_blocks * self.block_size, dtype=torch.bool)
        mask[written] = False
        def flat(t):
            return t.flatten(2, 3)  # [L, 2, N * B, H_kv, D]

        assert torch.equal(flat(self.cache.data)[:, :, mask], flat(before)[:, :, mask])

    @rule(table=consumes(seqs))
    def free(self, table):
        if table not in self.live:
            return
        free_before, held = self.allocator.num_free, len(table.blocks)
        table.free()
        self.live.remove(table)
        del self.shadow[id(table)]
        assert self.allocator.num_free == free_before + held

    @invariant()
    def gather_equals_shadow_bitwise(self):
        for table in self.live:
            assert table.num_blocks == -(-table.num_tokens // self.block_size)
            for layer in range(self.num_layers):
                ks, vs = self.shadow[id(table)][layer]
                empty = torch.empty(0, self.h_kv, self.d, dtype=self.dtype)
                want_k, want_v = torch.cat(ks or [empty]), torch.cat(vs or [empty])
                for blocks in (table.blocks, torch.tensor(table.blocks, dtype=torch.int64)):
                    k, v = self.cache.gather(layer, blocks, table.num_tokens)
                    assert k.shape == (table.num_tokens, self.h_kv, self.d)
                    assert torch.equal(k, want_k) and torch.equal(v, want_v)

    @invariant()
    def allocator_counts_table_entries(self):
        if self.cache is None:
            return
        check_allocator(self.allocator, self.live)

    def teardown(self):
        for table in self.live:
            table.free()
        if self.cache is not None:
            assert self.allocator.num_free == self.allocator.num_blocks


TestPagedKVMachine = PagedKVMachine.TestCase


# -- layout ----------------------------------------------------------------------
def test_kv_cache_is_one_allocation_with_layer_views():
    cache = KVCache(3, 5, 4, 2, 8, torch.float16)
    assert cache.data.shape == (3, 2, 5, 4, 2, 8) and cache.data.is_contiguous()
    for layer in range(3):
        k, v = cache.key(layer), cache.value(layer)
        assert k.shape == v.shape == (5, 4, 2, 8)
        assert k.untyped_storage().data_ptr() == cache.data.untyped_storage().data_ptr()
        assert k.data_ptr() == cache.data[layer, 0].data_ptr()
        assert v.data_ptr() == cache.data[layer, 1].data_ptr()
    cache.key(2)[4, 3] = 1.5  # a write through the view lands in data
    assert torch.all(cache.data[2, 0, 4, 3] == 1.5)
    assert cache.data.sum() == 1.5 * 2 * 8


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_kv_cache_write_then_read_slots_bitwise(dtype):
    """write puts token t's K/V at slot s: data[l, 0].view(N * B, ...)[s] == k[t] bitwise."""
    cache = KVCache(2, 4, 3, 2, 4, dtype)
    gen = torch.Generator().manual_seed(0)
    k = torch.randn(5, 2, 4, generator=gen).to(dtype)
    v = torch.randn(5, 2, 4, generator=gen).to(dtype)
    slots = torch.tensor([11, 0, 5, 6, 3])
    cache.write(1, k, v, slots)
    rows_k, rows_v = cache.key(1).reshape(12, 2, 4), cache.value(1).reshape(12, 2, 4)
    assert torch.equal(rows_k[slots], k) and torch.equal(rows_v[slots], v)
    assert torch.count_nonzero(cache.data[0]) == 0, "layer 0 was touched"


def test_kv_cache_negative_slots_are_skipped():
    """Padding (slot < 0) changes nothing in data, whatever its values."""
    cache = KVCache(2, 3, 2, 1, 2)
    k = torch.arange(8.0).view(4, 1, 2) + 1
    cache.write(0, k, -k, torch.tensor([-1, 4, -5, 1]))
    expected = torch.zeros_like(cache.data)
    expected[0, 0].view(6, 1, 2)[[4, 1]] = k[[1, 3]]
    expected[0, 1].view(6, 1, 2)[[4, 1]] = -k[[1, 3]]
    assert torch.equal(cache.data, expected)
    cache.write(1, k, k, torch.full((4,), -1))  # all padding: still nothing
    assert torch.equal(cache.data, expected)


@given(data=st.data(), b=block_sizes)
def test_kv_cache_gather_of_a_prefix_bitwise(data, b):
    """gather(num_tokens=t) for any t <= len is the first t tokens, bitwise."""
    length = data.draw(seq_lens(b, min_len=1), label="len")
    n = -(-length // b)
    allocator = BlockAllocator(n, data.draw(shuffled_free_list(n)))
    table, cache = BlockTable(allocator, b), KVCache(1, n, b, 2, 4)
    k, v = torch.randn(length, 2, 4), torch.randn(length, 2, 4)
    cache.write(0, k, v, torch.tensor(table.append(length)))
    t = data.draw(st.integers(0, length), label="t")
    gk, gv = cache.gather(0, table.blocks, t)
    assert torch.equal(gk, k[:t]) and torch.equal(gv, v[:t]) and gk.is_contiguous()


# -- sizing ------------------------------------------------------------------------
def test_kv_cache_bytes_per_block_opt13b_is_800kb_per_token():
    """The paper (§3): OPT-13B keeps 800 KB of KV per token (2 x 40 layers x 5120 x fp16)."""
    assert KVCache.bytes_per_block(40, 1, 40, 128, torch.float16) == 800 * 1024
    assert KVCache.bytes_per_block(40, 16, 40, 128, torch.float16) == 16 * 800 * 1024


@given(
    num_layers=st.integers(1, 3), b=block_sizes, h_kv=st.integers(1, 3),
    d=st.sampled_from([1, 4, 8]), dtype=st.sampled_from(DTYPES),
    blocks=st.integers(1, 20), extra=st.integers(0, 10_000),
)
def test_kv_cache_num_blocks_for_fills_the_budget(num_layers, b, h_kv, d, dtype, blocks, extra):
    """The cache sized from a budget fits in it, and one more block would not."""
    per_block = KVCache.bytes_per_block(num_layers, b, h_kv, d, dtype)
    budget = blocks * per_block + extra
    spare = h_kv * d * dtype.itemsize  # the one padding row write() needs
    if budget < per_block + spare:
        with pytest.raises(ValueError, match="holds no block"):
            KVCache.num_blocks_for(budget, num_layers, b, h_kv, d, dtype)
        return
    n = KVCache.num_blocks_for(budget, num_layers, b, h_kv, d, dtype)
    cache = KVCache(num_layers, n, b, h_kv, d, dtype)
    assert cache.data.numel() * cache.data.element_size() == n * per_block
    assert cache.nbytes <= budget < cache.nbytes + per_block


def test_kv_cache_num_blocks_for_too_small_budget_names_block_bytes():
    per_block = KVCache.bytes_per_block(2, 16, 4, 64, torch.bfloat16)
    with pytest.raises(ValueError, match=f"one block takes {per_block} bytes"):
        KVCache.num_blocks_for(per_block - 1, 2, 16, 4, 64, torch.bfloat16)
    with pytest.raises(ValueError, match="holds no block"):
        KVCache.num_blocks_for(-5, 2, 16, 4, 64, torch.bfloat16)


def test_kv_cache_num_blocks_for_takes_float_budgets_and_refuses_non_numbers():
    shape = (2, 16, 4, 64, torch.bfloat16)
    n = KVCache.num_blocks_for(4e9, *shape)
    assert isinstance(n, int) and n == KVCache.num_blocks_for(4_000_000_000, *shape)
    with pytest.raises(TypeError, match="number of bytes"):
        KVCache.num_blocks_for("4GB", *shape)
    with pytest.raises(ValueError, match="finite"):
        KVCache.num_blocks_for(float("inf"), *shape)


# -- errors: the specific exception, nothing changed --------------------------------
@pytest.mark.parametrize(
    "args, error, match",
    [
        ((0, 4, 4, 2, 8), ValueError, "num_layers"),
        ((1, 0, 4, 2, 8), ValueError, "num_blocks"),
        ((1, 4, -1, 2, 8), ValueError, "block_size"),
        ((1, 4, 4, 0, 8), ValueError, "num_kv_heads"),
        ((1, 4, 4, 2, 2.0), TypeError, "head_dim"),
    ],
)
def test_kv_cache_rejects_bad_dimensions(args, error, match):
    with pytest.raises(error, match=match):
        KVCache(*args)


def _filled_cache():
    cache = KVCache(2, 4, 2, 2, 4)
    cache.write(0, torch.ones(3, 2, 4), torch.ones(3, 2, 4), torch.tensor([0, 3, 5]))
    return cache


@pytest.mark.parametrize(
    "case, error, match",
    [
        ("layer", IndexError, "layer 2 is outside 0..1"),
        ("k_shape", ValueError, r"k has shape \(3, 2, 5\), expected .* \(3, 2, 4\)"),
        ("v_heads", ValueError, r"v has shape \(3, 1, 4\)"),
        ("length", ValueError, r"k has shape \(3, 2, 4\), expected .* \(2, 2, 4\)"),
        ("dtype", TypeError, "k has dtype torch.float64, the cache holds torch.float32"),
        ("slot_dtype", TypeError, "int64"),
        ("slot_2d", ValueError, "1-D"),
        ("slot_range", IndexError, "slot 8 is outside the cache's 8 slots"),
    ],
)
def test_kv_cache_write_rejects_bad_input_and_changes_nothing(case, error, match):
    cache = _filled_cache()
    before = cache.data.clone()
    k, v, slots, layer = torch.full((3, 2, 4), 9.0), torch.full((3, 2, 4), 9.0), torch.tensor([1, 2, 4]), 1
    if case == "layer":
        layer = 2
    elif case == "k_shape":
        k = torch.zeros(3, 2, 5)
    elif case == "v_heads":
        v = torch.zeros(3, 1, 4)
    elif case == "length":
        slots = torch.tensor([1, 2])
    elif case == "dtype":
        k = k.double()
    elif case == "slot_dtype":
        slots = slots.int()
    elif case == "slot_2d":
        slots = slots.view(3, 1)
    elif case == "slot_range":
        slots = torch.tensor([1, 8, 2])
    with pytest.raises(error, match=match):
        cache.write(layer, k, v, slots)
    assert torch.equal(cache.data, before)


@pytest.mark.parametrize(
    "layer, blocks, tokens, error, match",
    [
        (-1, [0], 1, IndexError, "layer -1"),
        (0, [0, 4], 3, IndexError, "block id 4 is outside 0..3"),
        (0, torch.tensor([-1, 0]), 3, IndexError, "block id -1"),
        (0, torch.tensor([0, 1], dtype=torch.int32), 3, TypeError, "int64"),
        (0, [0, 1], 5, ValueError, r"num_tokens=5 is outside 0..4"),
        (0, [0, 1], -1, ValueError, "num_tokens=-1"),
    ],
)
def test_kv_cache_gather_rejects_bad_input(layer, blocks, tokens, error, match):
    cache = _filled_cache()
    before = cache.data.clone()
    with pytest.raises(error, match=match):
        cache.gather(layer, blocks, tokens)
    assert torch.equal(cache.data, before)


def test_kv_cache_key_value_reject_bad_layer():
    cache = KVCache(2, 1, 1, 1, 1)
    for bad in (2, -1):
        with pytest.raises(IndexError, match="outside 0..1"):
            cache.key(bad)
        with pytest.raises(IndexError, match="outside 0..1"):
            cache.value(bad)


# -- on a GPU: the same round trip, and write() never waits for the device ------------
@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_kv_cache_cuda_write_has_no_host_sync_and_gathers_bitwise():
    """Padding is routed on the device, so write() makes no synchronising call (bitwise)."""
    cache = KVCache(2, 8, 4, 2, 8, torch.bfloat16, device="cuda")
    table = BlockTable(BlockAllocator(8, free_order=[5, 2, 7, 0, 1, 3, 4, 6]), 4)
    k = torch.randn(11, 2, 8, device="cuda").to(torch.bfloat16)
    v = torch.randn(11, 2, 8, device="cuda").to(torch.bfloat16)
    slots = torch.tensor(table.append(10) + [-1], device="cuda")  # the last token is padding
    torch.cuda.set_sync_debug_mode("error")
    try:
        cache.write(1, k, v, slots)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    gk, gv = cache.gather(1, table.blocks, 10)
    assert torch.equal(gk, k[:10]) and torch.equal(gv, v[:10])
    assert torch.count_nonzero(cache.data[0]) == 0
