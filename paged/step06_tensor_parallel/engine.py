"""The engine of step06: one scheduler and block manager driving W sharded ranks (paper §4.6, Figure 4).

Nothing in the scheduler changes. ``TensorParallelEngine`` is step05's
``PreemptingEngine`` with two differences:

* its own ``KVCache`` (rank 0's) holds ``H_kv / W`` heads, with the number of
  blocks the engine chose — every worker allocates the same number, so one
  block id means the same block on every rank and one block table serves all;
* its runner is a ``DriverRunner``: the plan the scheduler built is broadcast,
  and every rank executes it against its own shard and its own KV heads.

A byte budget (``kv_cache_memory``, ``swap_space``) is per rank, like vLLM's
per-GPU memory share: with W ranks, the same budget holds W times the blocks.

With ``tensor_parallel_size=1`` (the default) no process is started and the
engine is step05's exactly.

Extends: ``paged.step05_preemption.PreemptingEngine``.
"""

from __future__ import annotations

from paged.errors import RequestError
from paged.step05_preemption import PreemptingEngine
from paged.step06_tensor_parallel.runner import DriverRunner


class TensorParallelEngine(PreemptingEngine):
    """``PreemptingEngine`` over W tensor-parallel ranks.

    Args:
        model (LoadedModel | ShardedModel): a ``paged.models.LoadedModel`` (W = 1) or the ``ShardedModel`` of
            ``load_sharded(path, ..., tensor_parallel_size=W)`` (rank 0's shard and the workers).
        tensor_parallel_size: W; must match the model's.
        **kwargs (Any): as ``PreemptingEngine``.
    """

    def __init__(self, model, *, tensor_parallel_size: int = 1, **kwargs) -> None:
        workers = getattr(model, "workers", None)
        have = workers.world_size if workers is not None else 1
        if tensor_parallel_size != have:
            raise ValueError(
                f"tensor_parallel_size={tensor_parallel_size} but the model is split in {have}: load it with "
                "paged.step06_tensor_parallel.load_sharded(path, tensor_parallel_size=...) or use "
                "paged.LLM(model=path, tensor_parallel_size=...)"
            )
        self.tensor_parallel_size, self.workers = have, workers
        try:
            super().__init__(model, **kwargs)
            if workers is not None:
                # --8<-- [start:init]
                kv = self.scheduler.kv
                workers.send(("init", kv.num_blocks, self.block_size, kv.host.num_blocks, self.backend,
                              self.batch_invariant))
                workers.barrier()  # every rank has allocated the same blocks for its heads
                self.runner = DriverRunner(self.runner, workers)
                # --8<-- [end:init]
        except BaseException:
            if workers is not None:
                workers.stop("the engine could not start", graceful=False)
            raise

    def _num_kv_heads(self, cfg) -> int:
        return cfg.num_kv_heads // self.tensor_parallel_size

    def check_request(self, prompt_token_ids, params, priority: int = 0) -> None:
        """As step05; logits processors (Python callables) cannot travel to worker processes."""
        if self.workers is not None and params.logits_processors:
            raise RequestError("logits_processors run in-process only: not with tensor_parallel_size > 1",
                               param="logits_processors")
        super().check_request(prompt_token_ids, params, priority)

    def close(self) -> None:
        """Stop the worker processes (nothing to do when W = 1). The engine cannot step afterwards."""
        if self.workers is not None:
            self.workers.stop("closed")

    def fetch_kv(self) -> list[tuple]:
        """Debug: every rank's ``(KV cache data, swap pool data or None)``, rank 0 first (spawned workers)."""
        swap = self.runner.swap_cache.data if self.runner.swap_cache is not None else None
        mine = [(self.kv_cache.data, swap)]
        if self.workers is None:
            return mine
        theirs = self.workers.fetch_kv()
        return mine + [theirs[r] for r in sorted(theirs)]
