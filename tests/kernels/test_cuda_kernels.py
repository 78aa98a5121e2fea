"""The CUDA kernels of ``csrc/cuda`` against the oracle and plain indexing.

Every test runs twice: on a CUDA GPU (``paged.kernels.cuda``, marked ``cuda``,
skipped without one) and on the CPU through the device-emulation build of the
same sources (``paged.kernels.cuda_emulated``, marked ``emulated``; skipped,
saying so, only where no C++ compiler exists; a failed build fails). The
emulated cases keep their shapes small (a thread per fiber is slow) but cover
every dtype, block size and compiled head dim, GQA, empty and one-token
contexts and lengths on and around the block size and v2's partition
boundaries. ``tests/kernels/test_cuda_compile.py`` compiles the kernels with nvcc.

* Attention, v1 and v2: toleranced against ``tests/oracle.py::contiguous_attention``
  in float64 over the same rounded inputs (``CUDA_FLOAT32`` / ``CUDA_FLOAT16`` /
  ``CUDA_BFLOAT16``: float32 accumulation in another order plus one rounding of
  the output). Unused slots of the cache hold NaN and unused block-table entries
  hold -1, so a kernel that reads past ``#filled`` or past the sequence's blocks
  fails.
* ``write_kv`` and ``copy_blocks``: bitwise (``torch.equal``) against
  ``index_copy_`` / advanced indexing, because both are pure copies.
* The emulation runs float32 arithmetic without fused multiply-adds, a GPU with
  them; both stay within the same tolerances, which is what makes the emulated
  result evidence for the GPU one.
"""

from __future__ import annotations

import os
import shutil

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from tests import tolerances
from tests.oracle import contiguous_attention
from tests.strategies import gqa_heads, head_dims, seq_lens, shuffled_free_list

pytestmark = [pytest.mark.step03]

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
TOLERANCE = {
    torch.float32: tolerances.CUDA_FLOAT32,
    torch.float16: tolerances.CUDA_FLOAT16,
    torch.bfloat16: tolerances.CUDA_BFLOAT16,
}
CUDA_BLOCK_SIZES = [8, 16, 32]
COMPILED_HEAD_DIMS = [32, 64, 80, 96, 128]


@pytest.fixture(scope="module", params=[
    pytest.param("cuda", marks=[pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]),
    pytest.param("emulated", marks=pytest.mark.emulated),
])  # fmt: skip
def kernels(request):
    """(module, device): the GPU build on "cuda", the device emulation on "cpu"."""
    if request.param == "cuda":
        from paged.kernels import cuda

        cuda.load()  # a broken build fails here, with the compiler's output
        return cuda, "cuda"
    return emulated_kernels(), "cpu"


def emulated_kernels():
    """The device-emulation build; a skip only where there is no compiler at all."""
    from paged.kernels import cuda_emulated

    cxx = os.environ.get("CXX", "c++")
    if shutil.which(cxx) is None:
        pytest.skip(f"no C++ compiler ({cxx!r} is not on PATH): the CUDA device emulation cannot be built")
    cuda_emulated.load()  # a broken build fails here, with the compiler's output
    return cuda_emulated


@st.composite
def decode_batches(draw, small: bool = False):
    """A decode batch: shapes, context lengths (1, k*B +- 1, ...) and a shuffled layout.
    ``small`` (the emulation: every thread a fiber) caps it at 8 query heads,
    3 sequences and 4 blocks each."""
    block_size = draw(st.sampled_from(CUDA_BLOCK_SIZES))
    head_dim = draw(st.sampled_from([64, 128]))
    heads, kv_heads = draw(gqa_heads().filter(lambda p: p[0] <= 8) if small else gqa_heads())
    max_blocks, max_seqs = (4, 3) if small else (6, 4)
    lens = draw(st.lists(seq_lens(block_size, max_blocks=max_blocks, min_len=1), min_size=1, max_size=max_seqs))
    needed = sum(-(-n // block_size) for n in lens)
    free = draw(shuffled_free_list(needed + draw(st.integers(0, 3))))
    return dict(block_size=block_size, head_dim=head_dim, heads=heads, kv_heads=kv_heads,
                lens=lens, free=free, seed=draw(st.integers(0, 2**31 - 1)))  # fmt: skip


def _build(batch, dtype, device):
    """The paged cache (NaN where unused), block tables (-1 padded) and the per-sequence K/V."""
    b, d, h, h_kv = batch["block_size"], batch["head_dim"], batch["heads"], batch["kv_heads"]
    gen = torch.Generator().manual_seed(batch["seed"])
    free = list(batch["free"])
    num_blocks = len(free)
    key_cache = torch.full((num_blocks, b, h_kv, d), float("nan"), dtype=dtype)
    value_cache = torch.full_like(key_cache, float("nan"))
    width = max(-(-n // b) for n in batch["lens"]) + 1  # one spare column of -1
    tables = torch.full((len(batch["lens"]), width), -1, dtype=torch.int32)
    seqs = []
    for s, n in enumerate(batch["lens"]):
        blocks = [free.pop() for _ in range(-(-n // b))]
        tables[s, : len(blocks)] = torch.tensor(blocks, dtype=torch.int32)
        k = torch.randn(n, h_kv, d, generator=gen).to(dtype)
        v = torch.randn(n, h_kv, d, generator=gen).to(dtype)
        slots = torch.tensor([blocks[i // b] * b + i % b for i in range(n)], dtype=torch.int64)
        key_cache.view(-1, h_kv, d)[slots] = k
        value_cache.view(-1, h_kv, d)[slots] = v
        seqs.append((k, v))
    query = torch.randn(len(batch["lens"]), h, d, generator=gen).to(dtype)
    context_lens = torch.tensor(batch["lens"], dtype=torch.int32)
    return [t.to(device) for t in (query, key_cache, value_cache, tables, context_lens)], seqs


def _expected(query, seqs, scale):
    """The oracle per sequence, float64 on the CPU over the same rounded values; an
    empty context attends to nothing, which the kernels define as zeros."""
    q = query.cpu().double()
    return torch.cat([
        contiguous_attention(q[s : s + 1], k.double(), v.double(), scale) if len(k) else torch.zeros_like(q[s : s + 1])
        for s, (k, v) in enumerate(seqs)
    ])  # fmt: skip


def _check_attention(kernels, batch, dtype, version, partition_size=512):
    module, device = kernels
    (query, key_cache, value_cache, tables, context_lens), seqs = _build(batch, dtype, device)
    scale = batch["head_dim"] ** -0.5
    if version == "v1":
        out = module.paged_attention_v1(query, key_cache, value_cache, tables, context_lens, scale)
    else:
        out = module.paged_attention_v2(
            query, key_cache, value_cache, tables, context_lens, scale, partition_size=partition_size
        )
    assert out.shape == query.shape and out.dtype == dtype
    torch.testing.assert_close(out.cpu().double(), _expected(query, seqs, scale), **TOLERANCE[dtype])


@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
@given(data=st.data())
def test_cuda_paged_attention_v1_matches_oracle_toleranced(kernels, dtype, data):
    """v1 = contiguous attention, up to float32 reordering and one output rounding."""
    batch = data.draw(decode_batches(small=kernels[1] == "cpu"))
    _check_attention(kernels, batch, dtype, "v1")


@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
@given(data=st.data(), blocks_per_partition=st.sampled_from([1, 2, 3, 512]))
def test_cuda_paged_attention_v2_matches_oracle_toleranced(kernels, dtype, data, blocks_per_partition):
    """v2 = contiguous attention for partitions of 1, 2, 3 blocks (many partitions,
    a ragged last one) and of 512 blocks (one partition)."""
    batch = data.draw(decode_batches(small=kernels[1] == "cpu"))
    _check_attention(kernels, batch, dtype, "v2", partition_size=blocks_per_partition * batch["block_size"])


def _long_batch(kernels, head_dim, block_size=16):
    """On a GPU: thousands of tokens, GQA 4:1. Emulated: the lengths that matter
    for v2's default partition of 512 tokens (one short of it, on it, one past
    it, two partitions and one token) at a fraction of the cost, GQA 2:1."""
    on_gpu = kernels[1] == "cuda"
    lens = [1, 1023, 4097, 2560] if on_gpu else [1, 511, 512, 513, 1025]
    heads, kv_heads = (8, 2) if on_gpu else (2, 1)
    free = torch.randperm(600, generator=torch.Generator().manual_seed(0)).tolist()
    return dict(block_size=block_size, head_dim=head_dim, heads=heads, kv_heads=kv_heads, lens=lens, free=free,
                seed=head_dim)  # fmt: skip


@pytest.mark.parametrize("version", ["v1", "v2"])
@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
def test_cuda_paged_attention_long_context_toleranced(kernels, dtype, version):
    """Contexts across several of v2's 512-token partitions, for every head dim the
    kernels are compiled for."""
    for head_dim in COMPILED_HEAD_DIMS:
        _check_attention(kernels, _long_batch(kernels, head_dim), dtype, version)


@pytest.mark.parametrize("version", ["v1", "v2"])
@pytest.mark.parametrize("block_size", CUDA_BLOCK_SIZES)
def test_cuda_paged_attention_partition_edges_toleranced(kernels, block_size, version):
    """Every block size, with a partition of two blocks: contexts of 0 (zeros, not
    NaN), 1, B - 1, B, B + 1 and on and around 1, 2 and 3 partitions; GQA 4:1."""
    part = 2 * block_size
    lens = [0, 1, block_size - 1, block_size, block_size + 1, part - 1, part, part + 1, 2 * part, 3 * part + 1]
    batch = dict(block_size=block_size, head_dim=64, heads=4, kv_heads=1, lens=lens,
                 free=torch.randperm(64, generator=torch.Generator().manual_seed(block_size)).tolist(), seed=block_size)  # fmt: skip
    _check_attention(kernels, batch, torch.float32, version, partition_size=part)


def test_cuda_paged_attention_writes_into_out(kernels):
    """``out=`` is filled in place and returned; v1 and v2 agree on it."""
    module, device = kernels
    batch = dict(block_size=16, head_dim=64, heads=4, kv_heads=4, lens=[5, 40], free=list(range(8))[::-1], seed=1)
    (query, key_cache, value_cache, tables, context_lens), seqs = _build(batch, torch.float32, device)
    for fn in (module.paged_attention_v1, module.paged_attention_v2):
        out = torch.full_like(query, float("nan"))
        result = fn(query, key_cache, value_cache, tables, context_lens, 0.125, out=out)
        assert result.data_ptr() == out.data_ptr()
        torch.testing.assert_close(out.cpu().double(), _expected(query, seqs, 0.125), **tolerances.CUDA_FLOAT32)


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_cuda_paged_attention_accepts_strided_query(kernels, version):
    """A query that is a strided view of a fused QKV output (as the models pass it)
    gives the same result as its contiguous copy, bit for bit (same kernel, same data)."""
    module, device = kernels
    batch = dict(block_size=16, head_dim=128, heads=8, kv_heads=2, lens=[17, 300], free=list(range(24)), seed=3)
    (query, key_cache, value_cache, tables, context_lens), _ = _build(batch, torch.float16, device)
    fused = torch.cat([query.flatten(1), torch.zeros(2, 4 * 128, dtype=torch.float16, device=device)], dim=1)
    strided = fused[:, : 8 * 128].view(2, 8, 128)
    assert not strided.is_contiguous()
    fn = getattr(module, f"paged_attention_{version}")
    got = fn(strided, key_cache, value_cache, tables, context_lens, 128**-0.5)
    want = fn(query.contiguous(), key_cache, value_cache, tables, context_lens, 128**-0.5)
    assert torch.equal(got, want)


def test_cuda_paged_attention_rejects_bad_input(kernels):
    """Unsupported shapes and dtypes raise specific errors that name the limit."""
    module, dev = kernels
    q = torch.zeros(1, 2, 64, device=dev)
    cache = torch.zeros(4, 16, 2, 64, device=dev)
    tables = torch.zeros(1, 2, dtype=torch.int32, device=dev)
    lens = torch.ones(1, dtype=torch.int32, device=dev)
    with pytest.raises(ValueError, match="block size 4 is not compiled; supported: 8, 16, 32"):
        module.paged_attention_v1(q, cache[:, :4].contiguous(), cache[:, :4].contiguous(), tables, lens, 1.0)
    with pytest.raises(ValueError, match="head dim 48 is not compiled"):
        c48 = torch.zeros(4, 16, 2, 48, device=dev)
        module.paged_attention_v1(q[..., :48].contiguous(), c48, c48, tables, lens, 1.0)
    with pytest.raises(TypeError, match="int32"):
        module.paged_attention_v1(q, cache, cache, tables.long(), lens, 1.0)
    with pytest.raises(TypeError, match="share a dtype"):
        module.paged_attention_v1(q.half(), cache, cache, tables, lens, 1.0)
    with pytest.raises(ValueError, match="multiple of KV heads"):
        module.paged_attention_v1(torch.zeros(1, 3, 64, device=dev), cache, cache, tables, lens, 1.0)
    with pytest.raises(ValueError, match="partition_size must be a positive multiple of the block size 16"):
        module.paged_attention_v2(q, cache, cache, tables, lens, 1.0, partition_size=24)


@st.composite
def kv_writes(draw):
    """A cache shape (any head dim: the copy is dtype- and size-agnostic) and a
    batch of tokens with distinct slots, some of them -1 (padding)."""
    num_blocks, block_size = draw(st.integers(1, 6)), draw(st.sampled_from([1, 8, 16, 32]))
    heads, kv_heads = draw(gqa_heads())
    head_dim = draw(head_dims)
    slots = draw(st.lists(st.integers(0, num_blocks * block_size - 1), unique=True, max_size=40))
    padding = draw(st.lists(st.booleans(), min_size=len(slots), max_size=len(slots)))
    padded = [-1 if pad else s for s, pad in zip(slots, padding)]
    return dict(num_blocks=num_blocks, block_size=block_size, heads=heads, kv_heads=kv_heads,
                head_dim=head_dim, slots=padded, seed=draw(st.integers(0, 2**31 - 1)))  # fmt: skip


@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
@given(case=kv_writes())
def test_cuda_write_kv_bitwise_equals_index_copy(kernels, dtype, case):
    """write_kv = index_copy_ of the non-negative slots, bit for bit; k and v are
    strided views of one fused QKV projection, as the model produces them."""
    module, DEVICE = kernels
    n, b, h, h_kv, d = (case[k] for k in ("num_blocks", "block_size", "heads", "kv_heads", "head_dim"))
    gen = torch.Generator().manual_seed(case["seed"])
    t = len(case["slots"])
    qkv = torch.randn(t, (h + 2 * h_kv) * d, generator=gen).to(dtype).to(DEVICE)
    k = qkv[:, h * d : (h + h_kv) * d].view(t, h_kv, d)  # strided over tokens
    v = qkv[:, (h + h_kv) * d :].view(t, h_kv, d)
    key_cache = torch.randn(n, b, h_kv, d, generator=gen).to(dtype).to(DEVICE)
    value_cache = torch.randn(n, b, h_kv, d, generator=gen).to(dtype).to(DEVICE)
    slots = torch.tensor(case["slots"], dtype=torch.int64).to(DEVICE)
    keep = slots >= 0
    want_k, want_v = key_cache.clone(), value_cache.clone()
    want_k.view(-1, h_kv, d).index_copy_(0, slots[keep], k[keep])
    want_v.view(-1, h_kv, d).index_copy_(0, slots[keep], v[keep])
    module.write_kv(key_cache, value_cache, k, v, slots)
    assert torch.equal(key_cache, want_k) and torch.equal(value_cache, want_v)


@st.composite
def block_copies(draw):
    """A whole cache [L, 2, N, B, H_kv, D] and (src, dst) pairs with distinct
    destinations that are never sources (what copy-on-write produces)."""
    num_blocks = draw(st.integers(2, 12))
    order = draw(shuffled_free_list(num_blocks))
    num_pairs = draw(st.integers(0, num_blocks // 2))
    dst = order[:num_pairs]
    src = [draw(st.sampled_from(order[num_pairs:])) for _ in range(num_pairs)]  # may repeat
    shape = (draw(st.integers(1, 3)), 2, num_blocks, draw(st.sampled_from([1, 8, 16])),
             draw(st.integers(1, 3)), draw(head_dims))  # fmt: skip
    return dict(shape=shape, pairs=list(zip(src, dst)), on_gpu=draw(st.booleans()), seed=draw(st.integers(0, 2**31 - 1)))


@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
@given(case=block_copies())
def test_cuda_copy_blocks_bitwise_equals_indexing(kernels, dtype, case):
    """copy_blocks = kv[:, :, dst] = kv[:, :, src] in every layer, keys and values, bit for bit."""
    module, DEVICE = kernels
    gen = torch.Generator().manual_seed(case["seed"])
    kv = torch.randn(case["shape"], generator=gen).to(dtype).to(DEVICE)
    pairs = torch.tensor(case["pairs"], dtype=torch.int64).reshape(-1, 2)
    want = kv.clone()
    want[:, :, pairs[:, 1].to(DEVICE)] = want[:, :, pairs[:, 0].to(DEVICE)]
    module.copy_blocks(kv, pairs.to(DEVICE) if case["on_gpu"] else pairs)
    assert torch.equal(kv, want)


def test_cuda_copy_blocks_rejects_out_of_range_pairs(kernels):
    """CPU pairs are range-checked before the launch: a ValueError, the cache untouched."""
    module, DEVICE = kernels
    kv = torch.randn(2, 2, 4, 8, 1, 64, device=DEVICE)
    before = kv.clone()
    with pytest.raises(ValueError, match=r"must lie in \[0, 4\)"):
        module.copy_blocks(kv, torch.tensor([[0, 4]]))
    assert torch.equal(kv, before)



@pytest.mark.emulated
@pytest.mark.parametrize("version", ["v1", "v2"])
def test_cuda_emulated_trace_shows_the_documented_work_split(version):
    """The tracer of the emulation (docs/kernels.md's warp table): every (sequence, query
    head) attends each of its logical blocks exactly once, through its block-table
    entry, and warp w of a thread block takes the blocks first + w, first + w + 4, ...
    of its range (v1: the whole context; v2: a partition of 4 blocks). Exact integers."""
    module = emulated_kernels()
    b, part, heads = 8, 32, 2
    batch = dict(block_size=b, head_dim=64, heads=heads, kv_heads=1, lens=[100, 9, 1],
                 free=torch.randperm(20, generator=torch.Generator().manual_seed(2)).tolist(), seed=2)  # fmt: skip
    (query, key_cache, value_cache, tables, context_lens), _ = _build(batch, torch.float32, "cpu")
    with module.trace() as visits:
        if version == "v1":
            module.paged_attention_v1(query, key_cache, value_cache, tables, context_lens, 0.125)
        else:
            module.paged_attention_v2(query, key_cache, value_cache, tables, context_lens, 0.125, partition_size=part)
    per_partition = part // b if version == "v2" else 10**9
    for v in visits:
        first = v["partition"] * per_partition if version == "v2" else 0
        assert v["partition"] == (v["logical"] // per_partition if version == "v2" else 0), v
        assert v["warp"] == (v["logical"] - first) % 4, v
        assert v["physical"] == tables[v["seq"], v["logical"]], v
    for s, n in enumerate(batch["lens"]):
        for h in range(heads):
            seen = sorted(v["logical"] for v in visits if (v["seq"], v["head"]) == (s, h))
            assert seen == list(range(-(-n // b))), (s, h, seen)


def test_cuda_select_version_follows_the_documented_rule():
    """v1 within one partition or when S * H fills the GPU (up to 8192 tokens), else v2."""
    from paged.kernels.cuda import select_version

    assert select_version(1, 8, 512) == "v1"  # one partition: v2 would only add a reduce
    assert select_version(1, 8, 513) == "v2"  # two partitions, 8 thread blocks: split them
    assert select_version(64, 8, 4096) == "v1"  # 512 thread blocks fill the GPU
    assert select_version(63, 8, 4096) == "v2"
    assert select_version(64, 8, 8193) == "v2"  # too long for one thread block per head


@pytest.mark.emulated
def test_cuda_emulated_decode_dispatches_by_block_table_width():
    """``paged_attention_decode`` runs v2 for one long sequence and v1 for a short one:
    bitwise equal to the version it picked (the same kernel on the same data)."""
    module = emulated_kernels()
    for lens, version in (([600], "v2"), ([40], "v1")):
        batch = dict(block_size=16, head_dim=32, heads=2, kv_heads=1, lens=lens, free=list(range(40))[::-1], seed=4)
        (query, key_cache, value_cache, tables, context_lens), _ = _build(batch, torch.float32, "cpu")
        got = module.paged_attention_decode(query, key_cache, value_cache, tables, context_lens, 0.17)
        want = getattr(module, f"paged_attention_{version}")(query, key_cache, value_cache, tables, context_lens, 0.17)
        args = (query, key_cache, value_cache, tables, context_lens, 0.17)
        other = module.paged_attention_v1(*args) if version == "v2" else module.paged_attention_v2(*args, partition_size=16)
        assert torch.equal(got, want) and not torch.equal(got, other), lens
