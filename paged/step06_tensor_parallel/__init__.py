"""Step 06 — tensor parallelism: one scheduler and block manager, W sharded workers (paper §4.6).

Adds: ``TPGroup`` (the process group as an argument), the Megatron-style
sharded layers and ``shard_model`` (applied to the ``paged.models``
definitions, loading each rank's slices only), the worker processes and their
fault handling (``load_sharded``, ``WorkerGroup``, ``WorkerError``), the
runners (``ShardRunner`` on workers, ``DriverRunner`` on rank 0) and
``TensorParallelEngine``, with the step's ``LLM``. Across machines: ``hosts``
(``Nodes``: the ranks over N hosts, a headless host's ranks, heartbeats that
name a lost host), started by ``python -m paged.serve --nnodes N ...``, or by
torchrun through ``torchrun_entry``.
"""

from paged._lazy import lazy_package

# each name -> the module that defines it ("module:attribute" where the name differs)
_OWN = {
    "DriverRunner": "runner",
    "Nodes": "hosts",
    "ParallelLMHead": "sharding",
    "RowParallelLinear": "sharding",
    "ShardRunner": "runner",
    "ShardedModel": "sharded_model",
    "TPGroup": "group",
    "TensorParallelEngine": "engine",
    "VocabParallelEmbedding": "sharding",
    "WorkerError": "group",
    "WorkerGroup": "worker_group",
    "check_shardable": "sharding",
    "connect": "group",
    "free_loopback_port": "group",
    "load_shard": "sharding",
    "load_sharded": "sharded_model",
    "shard_model": "sharding",
    "LLM": "llm",
}
__all__, __getattr__, __dir__ = lazy_package(__name__, _OWN, below="paged.step05_preemption")
