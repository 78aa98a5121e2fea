"""The engine of the replay: step05's scheduler unchanged, a stand-in for the model.

``ReplayEngine`` is the throughput bench's engine (``ReservingEngine``: the
step05 ``PreemptingEngine`` with ``memory="paged" | "orca-..."``) with one
class attribute changed, ``runner_class = ReplayRunner``. Everything that
decides what an iteration does — FCFS admission, block allocation, forks and
copy-on-write, prefix caching, gang preemption by swap or recompute, chunked
prefill, the Orca reservations — is the same code a real run executes; the
tests check that a replayed trace produces the same ``StepPlan``s as a run of
a real model.

``ReplayRunner`` is step03's ``StandInRunner`` (``paged.step03_attention.stand_in``:
what a ``ModelRunner`` returns, drawn from a hash of seed and position; in
``ignore_eos`` runs the tokens' values change nothing downstream) with a
clock: it advances its ``elapsed`` seconds by the ``CostModel`` of the plan.

The stand-in "model" (``stand_in_model``) has one layer, one KV head of one
dimension and a tiny parameter, so the KV cache tensor the engine allocates
for the paper's thousand blocks is a few kilobytes; nothing reads it.

Preemption uses the engine's ``"auto"`` rule unchanged. It ranks recompute
against swap by the model's parameter count, and the stand-in has one
parameter, so a single sequence is always recomputed and a group (parallel
samples, beams) swapped while the host pool has room: vLLM's own default
policy. The clock charges each choice as the paper's hardware would: the
recomputed tokens as prefill, the swapped blocks over PCIe.
"""

from __future__ import annotations

from pathlib import Path

import torch

from paged.bench.reservation import ReservingEngine
from paged.models.config import ModelConfig
from paged.models.loader import LoadedModel
from paged.step02_block_table import KVCache
from paged.sampling.sampler import SampleResult
from paged.step03_attention.stand_in import VOCAB, StandInRunner

def stand_in_model(max_len: int = 2048, eos: int = 2) -> LoadedModel:
    """A ``LoadedModel`` the engine accepts: 1 layer, 1 KV head of dimension 1, float16, no tokenizer."""
    config = ModelConfig(architecture="llama", model_type="llama", vocab_size=VOCAB, hidden_size=1, num_layers=1,
                         num_heads=1, num_kv_heads=1, head_dim=1, intermediate_size=1,
                         max_position_embeddings=max_len, eos_token_ids=(eos,))
    module = torch.nn.Linear(1, 1, bias=False).to(torch.float16)
    return LoadedModel(module, config, None, [eos], Path("stand-in"))


class ReplayRunner(StandInRunner):
    """A ``ModelRunner`` stand-in: results from a hash, time from a cost model (module docstring)."""

    swap_cache = None  # a runner's host pool: the replay moves no data
    cost = None  # a replay_cost.CostModel, set by ReplayEngine; None: the clock stands still

    def __init__(self, model, kv_cache, backend, batch_invariant: bool = False, host_blocks: int = 0) -> None:
        super().__init__()
        self.kv_cache, self.backend = kv_cache, backend
        self.elapsed = 0.0  # seconds of the modelled hardware, all iterations so far

    def execute(self, plan) -> dict[int, SampleResult]:
        if self.cost is not None:
            self.elapsed += self.cost.plan_time(plan)
        return super().execute(plan)


class ReplayEngine(ReservingEngine):
    """The throughput bench's engine with ``ReplayRunner``; ``cost`` sets the runner's clock.

    Args:
        cost: a ``replay_cost.CostModel``, or None (a clock that stands still: tests of scheduling).
        swap_blocks: host blocks for swapped-out sequences (the engine's ``swap_space`` counts
            bytes, and a stand-in block is a few bytes).
        **kwargs: as ``ReservingEngine`` (``memory=``, ``block_size``, ``num_blocks``, ...).
    """

    runner_class = ReplayRunner

    def __init__(self, model, *, cost=None, swap_blocks: int = 0, **kwargs) -> None:
        if "swap_space" in kwargs:
            raise TypeError("ReplayEngine takes swap_blocks (host blocks), not swap_space (bytes)")
        c = model.config
        per_block = KVCache.bytes_per_block(c.num_layers, kwargs.get("block_size", 16), c.num_kv_heads,
                                            c.head_dim, next(model.model.parameters()).dtype)
        kwargs.setdefault("attention_backend", "reference")  # nothing runs attention: build no kernel
        super().__init__(model, swap_space=swap_blocks * per_block, **kwargs)
        self.runner.cost = cost

    @property
    def elapsed(self) -> float:
        """Seconds of modelled hardware time so far."""
        return self.runner.elapsed
