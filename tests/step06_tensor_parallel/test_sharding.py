"""Sharding without processes: refusals at start, and each rank reading exactly its slices.

The loader, given one rank's ``shard_model``, must fill every parameter of the
shard with the matching slice of the checkpoint: rows ``r/W`` of each part of a
fused q/k/v or gate/up projection, columns ``r/W`` of a row-parallel weight,
a block of vocabulary rows, and everything else whole. Checked bitwise
(``torch.equal``): the shard's values are copies of the checkpoint's, no
arithmetic happens. A group of W ranks is described by a ``TPGroup`` without
connections: loading needs none.
"""

import multiprocessing
import tempfile

import pytest
import torch

from paged.models import load_model, read_config
from paged.step06_tensor_parallel import LLM, TPGroup, check_shardable, load_shard, load_sharded
from paged.step06_tensor_parallel.sharding import RowParallelLinear, VocabParallelEmbedding
from tests.hf_models import build_hf_model, save_checkpoint


@pytest.fixture(scope="module")
def paths():
    out = {kind: save_checkpoint(build_hf_model(kind), tempfile.mkdtemp())
           for kind in ("llama", "llama_tied_bias", "opt_350m")}
    # 157 = 2 * 79 - 1: rank 1's last vocabulary row is padding
    out["llama_vocab157"] = save_checkpoint(build_hf_model("llama", vocab_size=157), tempfile.mkdtemp())
    return out


@pytest.mark.parametrize("world, needle", [(3, "4 attention heads and 2 KV heads"), (4, "2 KV heads is not")])
def test_check_shardable_refuses_uneven_splits_naming_the_counts(paths, world, needle):
    with pytest.raises(ValueError, match=needle) as err:
        check_shardable(read_config(paths["llama"]), world)
    assert "sizes that work: 1, 2" in str(err.value)
    check_shardable(read_config(paths["llama"]), 2)  # 4 heads / 2 KV heads / MLP 96 split in two


def test_unsupported_split_refused_before_any_process_starts(paths):
    before = set(multiprocessing.active_children())
    with pytest.raises(ValueError, match="tensor_parallel_size=3 cannot split"):
        LLM(model=str(paths["llama"]), dtype="float64", tensor_parallel_size=3)
    with pytest.raises(ValueError, match="tensor_parallel_size=4 cannot split"):
        load_sharded(paths["llama"], torch.float64, "cpu", 4)
    assert set(multiprocessing.active_children()) == before


def _slices(full: torch.Tensor, parts, r, w, dim=0):
    """Rank r's 1/W of each consecutive part (sizes ``parts``) of ``full`` along ``dim``, concatenated."""
    out, start = [], 0
    for n in parts:
        k = n // w
        out.append(full.narrow(dim, start + r * k, k))
        start += n
    return torch.cat(out, dim)


def _found(full: torch.Tensor, part: torch.Tensor) -> str:
    """Where ``part``'s first row sits in ``full`` (``"0..7"``), or "" when it is not one of its rows."""
    if part.dim() != 2 or part.shape[1] != full.shape[1]:
        return ""
    hits = [i for i in range(full.shape[0]) if torch.equal(full[i], part[0])]
    return f"{hits[0]}..{hits[0] + part.shape[0] - 1}" if hits else ""


@pytest.mark.parametrize("kind, world", [("llama", 2), ("llama_tied_bias", 4), ("opt_350m", 2), ("llama_vocab157", 2)])
def test_each_rank_loads_exactly_its_slices_bitwise(paths, kind, world):
    """Rank r of W holds, bitwise, rows r/W of each part of a column-parallel weight, columns r/W of a
    row-parallel one, its block of vocabulary rows, and every other tensor whole."""
    full = load_model(paths[kind], dtype=torch.float64)
    cfg, params = full.config, dict(full.model.named_parameters())
    for r in range(world):
        shard = load_shard(paths[kind], torch.float64, "cpu", TPGroup(r, world)).model
        numel = 0
        for name, p in shard.named_parameters():
            numel += p.numel()
            module = shard.get_submodule(name.rpartition(".")[0])
            f = params[name]
            if isinstance(module, VocabParallelEmbedding) or name == "lm_head.weight":
                per = -(-cfg.vocab_size // world)
                want = torch.zeros_like(p)
                real = f[r * per:(r + 1) * per]
                want[: len(real)] = real
            elif isinstance(module, RowParallelLinear) and name.endswith("weight"):
                want = _slices(f, [f.shape[1]], r, world, dim=1)
            elif p.shape != f.shape:  # column-parallel: each fused part split by rows
                parts = getattr(full.model.get_submodule(name.rpartition(".")[0]), "output_sizes", [f.shape[0]])
                want = _slices(f, parts, r, world)
            else:
                want = f
            assert torch.equal(p, want), (
                f"{kind}, rank {r} of {world}: {name} {tuple(p.shape)} is not the checkpoint's slice for this rank "
                + (f"(its rows equal the checkpoint's rows {_found(f, p)})" if _found(f, p) else ""))
        attn = next(m for m in shard.modules() if hasattr(m, "num_heads"))
        assert attn.num_heads == cfg.num_heads // world
        assert getattr(attn, "num_kv_heads", attn.num_heads) == cfg.num_kv_heads // world
        # a rank holds its share, not the model: (1/W of the sharded tensors) + the replicated ones
        assert numel < sum(p.numel() for p in params.values()) * (1 / world + 0.25)
