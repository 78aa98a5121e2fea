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

from paged.step05_preemption import *  # noqa: F401,F403  (the ladder: re-export step05)
from paged.step05_preemption import __all__ as _step05_all
from paged.step06_tensor_parallel.engine import TensorParallelEngine
from paged.step06_tensor_parallel.group import TPGroup, connect, free_loopback_port
from paged.step06_tensor_parallel.hosts import Nodes
from paged.step06_tensor_parallel.llm import LLM
from paged.step06_tensor_parallel.runner import DriverRunner, ShardRunner
from paged.step06_tensor_parallel.sharding import (
    ParallelLMHead,
    RowParallelLinear,
    VocabParallelEmbedding,
    check_shardable,
    load_shard,
    shard_model,
)
from paged.step06_tensor_parallel.sharded_model import ShardedModel, load_sharded
from paged.step06_tensor_parallel.worker_group import WorkerError, WorkerGroup

__all__ = [n for n in _step05_all if n != "LLM"] + [
    "LLM",
    "DriverRunner",
    "Nodes",
    "ParallelLMHead",
    "RowParallelLinear",
    "ShardRunner",
    "ShardedModel",
    "TPGroup",
    "TensorParallelEngine",
    "VocabParallelEmbedding",
    "WorkerError",
    "WorkerGroup",
    "check_shardable",
    "connect",
    "free_loopback_port",
    "load_shard",
    "load_sharded",
    "shard_model",
]
