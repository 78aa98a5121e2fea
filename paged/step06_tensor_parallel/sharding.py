"""Megatron-style sharding of the ``paged.models`` definitions (paper §4.6, Figure 4).

The models are not rewritten: ``shard_model`` takes one built on the meta
device and substitutes, for rank ``r`` of ``W``, the modules the model's
``tp_plan`` names, then tells the loader which slice of each checkpoint
tensor each parameter reads:

* **column-parallel** (q/k/v, gate/up, OPT's fc1): an ordinary linear with
  ``1/W`` of the output rows — of each part of a fused ``MergedLinear``, so
  rank ``r`` gets heads ``r*H/W .. (r+1)*H/W`` of q and the matching KV
  heads of k and v. No communication: its output feeds the next layer.
* **row-parallel** (o_proj, down_proj, OPT's out_proj and fc2): the matching
  ``1/W`` of the input columns; each rank's partial product is summed with
  one all-reduce, and the bias is added once, after the sum.
* **attention**: each rank attends with ``H/W`` query heads and ``H_kv/W`` KV
  heads (``num_heads`` / ``num_kv_heads`` set on the module), so its
  ``KVCache`` holds only those heads.
* **vocabulary-parallel embedding**: rows ``r*ceil(V/W) ..``; a token outside
  the slice reads zeros, and an all-reduce adds the one rank that has it.
* **LM head**: the same vocabulary rows; the logits of every rank are
  all-gathered, so rank 0 samples over the whole vocabulary.
* everything else (norms, RoPE, OPT's learned positions, project_in/out) is
  replicated.

Two all-reduces per layer, one per embedding lookup, one all-gather per
sampled batch: the communication Figure 4 leaves to "the standard Megatron-LM
protocol", with no coordination from the scheduler.

Invariants: W divides the query heads, the KV heads and the MLP width
(``check_shardable`` refuses anything else before a process starts).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from paged.models.base import CausalLM
from paged.models.config import ModelConfig
from paged.models.layers import Linear, MergedLinear, gemm
from paged.step06_tensor_parallel.group import TPGroup


def check_shardable(config: ModelConfig, world_size: int) -> None:
    """Raise ``ValueError`` unless ``world_size`` splits the heads, KV heads and MLP width evenly."""
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"tensor_parallel_size must be an int >= 1, got {world_size!r}")
    counts = {"attention heads": config.num_heads, "KV heads": config.num_kv_heads,
              "MLP width (intermediate_size)": config.intermediate_size}
    bad = [f"{n} {what}" for what, n in counts.items() if n % world_size]
    if bad:
        ok = [w for w in range(1, config.num_kv_heads + 1) if all(n % w == 0 for n in counts.values())]
        raise ValueError(
            f"tensor_parallel_size={world_size} cannot split this model: {' and '.join(bad)} "
            f"{'is' if len(bad) == 1 else 'are'} not divisible by {world_size} (the model has "
            f"{config.num_heads} attention heads, {config.num_kv_heads} KV heads); "
            f"sizes that work: {', '.join(map(str, ok))}"
        )


# --8<-- [start:row]
class RowParallelLinear(nn.Module):
    """``y = all_reduce(x_r @ W_r^T) + b``: this rank's ``in/W`` input columns of a linear.

    Args:
        in_features: this rank's share of the input width.
        out_features: full output width.
        bias: whether the layer has a bias (replicated, added once after the sum).
        group: the tensor-parallel group.
    """

    pad_one_row = False  # batch-invariant mode: a lone row multiplied as two (``layers.gemm``)
    fixed_order = False  # or a fixed-order kernel instead (``layers.use_fixed_order_linears``)
    pair_weight = None  # with fixed_order: the weight laid out for the pair order (``layers.pack_pair_order_linears``)

    def __init__(self, in_features: int, out_features: int, bias: bool, group: TPGroup):
        super().__init__()
        self.in_features, self.out_features, self.group = in_features, out_features, group
        self.weight = nn.Parameter(torch.empty(out_features, in_features))
        self.bias = nn.Parameter(torch.empty(out_features)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [T, in/W] -> [T, out]
        y = self.group.all_reduce(gemm(self, x))  # partial sums of every rank added
        return y + self.bias if self.bias is not None else y
# --8<-- [end:row]


def _vocab_rows(vocab_size: int, group: TPGroup) -> tuple[int, int, int]:
    """(rows per rank, first token id of this rank, token ids it really holds)."""
    per = math.ceil(vocab_size / group.world_size)
    start = group.rank * per
    return per, start, max(0, min(per, vocab_size - start))


# --8<-- [start:vocab]
class VocabParallelEmbedding(nn.Module):
    """Token embedding holding rows ``start .. start + ceil(V/W)`` of the table.

    Each rank looks up the ids it holds and writes zeros for the others; the
    all-reduce then adds the one non-zero row of each token (adding zeros is
    exact, so the result equals the unsharded lookup bit for bit).
    """

    def __init__(self, vocab_size: int, dim: int, group: TPGroup):
        super().__init__()
        self.vocab_size, self.group = vocab_size, group
        per, self.start, self.num_real = _vocab_rows(vocab_size, group)
        self.weight = nn.Parameter(torch.empty(per, dim))  # the last rank's tail is zero padding

    def forward(self, ids: torch.Tensor) -> torch.Tensor:  # [T] -> [T, dim]
        local = ids - self.start
        outside = (local < 0) | (local >= self.num_real)
        x = F.embedding(local.masked_fill(outside, 0), self.weight)
        return self.group.all_reduce(x.masked_fill(outside.unsqueeze(-1), 0))


class ParallelLMHead(nn.Module):
    """LM head over the same vocabulary rows; logits of all ranks gathered to ``[T', V]``."""

    pad_one_row = False  # batch-invariant mode: a lone row multiplied as two (``layers.gemm``)
    fixed_order = False  # or a fixed-order kernel instead (``layers.use_fixed_order_linears``)
    pair_weight = None  # with fixed_order: the weight laid out for the pair order (``layers.pack_pair_order_linears``)

    def __init__(self, vocab_size: int, dim: int, group: TPGroup):
        super().__init__()
        self.vocab_size, self.group = vocab_size, group
        per, _, _ = _vocab_rows(vocab_size, group)
        self.weight = nn.Parameter(torch.empty(per, dim))

    def forward(self, h: torch.Tensor) -> torch.Tensor:  # [T', dim] -> [T', V]
        local = gemm(self, h)  # [T', ceil(V/W)]: this rank's slice of the vocabulary
        return self.group.all_gather(local, dim=-1)[:, : self.vocab_size]
# --8<-- [end:vocab]


def _set_module(model: nn.Module, name: str, module: nn.Module) -> None:
    parent, _, short = name.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, short, module)


Read = tuple[str, int, int, tuple | None]  # checkpoint name, first row, row count, slice to read


# --8<-- [start:split]
def column_reads(parts: list[tuple[str, int, int]], rank: int, world_size: int) -> list[Read]:
    """Column parallel: rank ``r`` of ``W`` reads ``1/W`` of the output rows of every part.

    Args:
        parts: ``(checkpoint name, first row in the fused weight, rows)`` per part
            (q, k and v of a fused qkv; gate and up; one part for a plain linear).
        rank: ``r``.
        world_size: ``W``.

    Returns:
        Per part ``(checkpoint name, first row in the rank's fused weight, its rows, index)``:
        rows ``r*n/W .. (r+1)*n/W`` of the part, placed at ``row/W`` in the shard.
    """
    w, r = world_size, rank
    return [(ck, row // w, n // w, (slice(r * n // w, (r + 1) * n // w),)) for ck, row, n in parts]


def row_reads(parts: list[tuple[str, int, int]], in_features: int, rank: int) -> list[Read]:
    """Row parallel: rank ``r`` reads the input columns ``r*k .. (r+1)*k`` of the weight.

    Args:
        parts: the single ``(checkpoint name, 0, rows)`` of the weight.
        in_features: ``k``, the rank's share of the input width (``in / W``).
        rank: ``r``.

    Returns:
        One read: every output row, the rank's block of ``k`` input columns.
    """
    (ck, _, n), = parts
    k = in_features
    return [(ck, 0, n, (slice(None), slice(rank * k, (rank + 1) * k)))]
# --8<-- [end:split]


# --8<-- [start:shard]
def shard_model(model: CausalLM, layout: dict[str, list[tuple[str, int, int]]],
                group: TPGroup) -> dict[str, list[Read]]:
    """Cut ``model`` (on the meta device) down to rank ``group.rank``'s modules.

    Args:
        model: a ``paged.models`` causal LM built on the meta device.
        layout: its ``checkpoint_layout()`` (parameter -> checkpoint parts).
        group: this rank's tensor-parallel group, kept by the modules that communicate.

    Returns:
        parameter name -> ``(checkpoint name, first row, row count, index)`` reads for the loader,
        ``index`` the slice of the checkpoint tensor this rank holds (None: all of it).
    """
    w, r = group.world_size, group.rank
    check_shardable(model.config, w)
    kind: dict[str, str] = {}  # module name -> "column" | "row" | "vocab"
    embed = model.get_input_embeddings()
    with torch.device("meta"):
        for name, module in list(model.named_modules()):
            plan = model.tp_plan.get(name.rpartition(".")[2])
            bias = getattr(module, "bias", None) is not None
            if plan == "column" and isinstance(module, MergedLinear):
                new = MergedLinear(module.in_features, tuple(s // w for s in module.output_sizes), bias)
            elif plan == "column":
                new = Linear(module.in_features, module.out_features // w, bias=bias)
            elif plan == "row":
                new = RowParallelLinear(module.in_features // w, module.out_features, bias, group)
            elif module is embed:
                plan, new = "vocab", VocabParallelEmbedding(embed.num_embeddings, embed.embedding_dim, group)
            elif name == "lm_head":
                plan, new = "vocab", ParallelLMHead(module.out_features, module.in_features, group)
            else:
                if hasattr(module, "num_heads"):  # an attention module: this rank's heads only
                    module.num_heads //= w
                    if hasattr(module, "num_kv_heads"):
                        module.num_kv_heads //= w
                continue
            _set_module(model, name, new)
            kind[name] = plan
    model.tie_weights()
    reads: dict[str, list[Read]] = {}
    for pname, parts in layout.items():
        module_name, _, leaf = pname.rpartition(".")
        how = kind.get(module_name)
        if how == "column":
            reads[pname] = column_reads(parts, r, w)
        elif how == "row" and leaf == "weight":
            reads[pname] = row_reads(parts, model.get_submodule(module_name).in_features, r)
        elif how == "vocab":  # a block of vocabulary rows
            (ck, _, _), = parts
            per, start, real = _vocab_rows(model.config.vocab_size, group)
            reads[pname] = [(ck, 0, real, (slice(start, start + real),))] if real else []
        else:  # replicated: norms, positions, biases of row-parallel layers, project_in/out
            reads[pname] = [(ck, row, n, None) for ck, row, n in parts]
    return reads
# --8<-- [end:shard]


def load_shard(path, dtype, device, group: TPGroup):
    """``paged.models.load_model`` for one rank: its modules, filled from its slices of the checkpoint."""
    from paged.models import load_model

    return load_model(path, dtype=dtype, device=device, shard=lambda m, layout: shard_model(m, layout, group))
