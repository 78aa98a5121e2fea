"""``LLM`` at step06: the API over the tensor-parallel engine (``tensor_parallel_size``).

    >>> from paged import LLM, SamplingParams
    >>> with LLM(model="path/to/checkpoint", tensor_parallel_size=2) as llm:
    ...     out = llm.generate(["Hello"], SamplingParams(temperature=0, max_tokens=8))

With ``tensor_parallel_size=1`` (the default) no worker process starts and
everything is as at step05.
"""

from __future__ import annotations

from datetime import timedelta

from paged.step05_preemption import LLM as Step05LLM
from paged.step06_tensor_parallel.engine import TensorParallelEngine
from paged.step06_tensor_parallel.hosts import DEFAULT_MASTER_PORT, Nodes
from paged.step06_tensor_parallel.sharded_model import load_sharded


class LLM(Step05LLM):
    """As ``paged.step05_preemption.LLM``; adds ``tensor_parallel_size`` and ``close()``.

    Args:
        tensor_parallel_size: W shards of the model, each in its own process (rank 0 is this one).
        launcher: ``"spawn"`` (start the W-1 workers here) or ``"torchrun"`` (they were started by
            torchrun, maybe on other machines; see ``python -m paged.step06_tensor_parallel.torchrun_entry``).
        nnodes: across hosts (spawn): this is node 0 of ``nnodes``, holding ranks 0..W/nnodes-1; the
            other nodes join from their hosts (``python -m paged.serve --headless``; see
            ``paged.step06_tensor_parallel.hosts``).
        master_addr: this host's address, as the other nodes reach it (vLLM's name).
        master_port: the port the other nodes' ranks join at (vLLM's name).
        distributed_timeout: seconds any one collective may wait (default 300); across hosts, how soon a
            cut link is noticed.
        join_timeout: seconds to wait for the other nodes' ranks (default 600).
        **engine_args (Any): as ``paged.step05_preemption.LLM``.
    """

    engine_class = TensorParallelEngine

    def __init__(self, model: str | None = None, dtype="auto", device: str = "cpu",
                 tensor_parallel_size: int = 1, launcher: str = "spawn", nnodes: int = 1,
                 master_addr: str = "127.0.0.1", master_port: int = DEFAULT_MASTER_PORT,
                 distributed_timeout: float | None = None, join_timeout: float | None = None,
                 **engine_args) -> None:
        self.tensor_parallel_size, self.launcher = tensor_parallel_size, launcher
        self.nodes = Nodes(nnodes, master_addr, master_port)
        self.nodes.check(tensor_parallel_size)
        for name, seconds in (("distributed_timeout", distributed_timeout), ("join_timeout", join_timeout)):
            if seconds is not None and not seconds > 0:
                raise ValueError(f"{name} must be > 0 seconds, got {seconds}")
        self._timeouts = {k: timedelta(seconds=v) for k, v in
                          (("timeout", distributed_timeout), ("join_timeout", join_timeout)) if v is not None}
        try:
            super().__init__(model, dtype, device, tensor_parallel_size=tensor_parallel_size, **engine_args)
        except BaseException:  # e.g. an unknown engine argument: do not leave workers behind
            workers = getattr(getattr(self, "model", None), "workers", None)
            if workers is not None:
                workers.stop("LLM could not start", graceful=False)
            raise

    def _load_model(self, dtype, device):
        if self.tensor_parallel_size == 1:
            return super()._load_model(dtype, device)
        if self.quantization is not None:
            raise ValueError(f"quantization={self.quantization!r} runs in one process; it cannot be combined with "
                             f"tensor_parallel_size={self.tensor_parallel_size}")
        return load_sharded(self.model_path, dtype, device, self.tensor_parallel_size, launcher=self.launcher,
                            nodes=self.nodes, **self._timeouts)

    def close(self) -> None:
        """Stop the worker processes (when ``tensor_parallel_size > 1``)."""
        self.engine.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()
