"""The runners of step06: every rank executes the same plan; only rank 0 samples (paper §4.6).

``ShardRunner`` is step05's runner on ranks 1..W-1: swaps, copies and the
forward pass over its heads, the LM head's all-gather included, but no draw —
the logits it gathered are dropped, because the driver alone samples.

``DriverRunner`` is rank 0's runner as the engine sees it: the same
``execute(plan) -> {seq_id: SampleResult}`` as every runner before it, so the
step05 engine drives W processes without a change. It broadcasts the plan,
then runs it as one of the W ranks. If anything fails on the way — a worker
died, a worker raised, a collective timed out, Ctrl-C — it stops every worker
and raises; the error names the rank at fault.

Extends: ``paged.step05_preemption.PreemptingModelRunner``.
"""

from __future__ import annotations

from paged.step03_attention import StepPlan
from paged.step05_preemption import PreemptingModelRunner


class ShardRunner(PreemptingModelRunner):
    """Step05's runner on a worker rank: everything but the sampling."""

    def _draw(self, logits, rows, plan):
        return {}


# --8<-- [start:driver]
class DriverRunner:
    """Rank 0: broadcast each plan to the workers, then execute it here too.

    Args:
        local: rank 0's own ``PreemptingModelRunner`` (its shard, its KV heads; it samples).
        workers (WorkerGroup): the handle on ranks 1..W-1.
    """

    def __init__(self, local: PreemptingModelRunner, workers) -> None:
        self.local, self.workers = local, workers

    def execute(self, plan: StepPlan) -> dict:
        self.workers.send(plan)  # the same plan to every rank
        try:
            return self.local.execute(plan)  # collectives inside: every rank runs the same plan
        except BaseException as exc:
            self.workers.fail(exc)  # stops every process; raises WorkerError naming the rank at fault
# --8<-- [end:driver]

    def __getattr__(self, name):  # kv_cache, swap_cache, ... are rank 0's
        if name == "local":
            raise AttributeError(name)
        return getattr(self.local, name)
