"""Step 05 — scheduling under memory pressure: gang preemption, swap and recompute (paper §4.5).

Adds: ``SwapSpace`` (the host block pool and the block moves), the swap-or-
recompute ``policy``, ``PreemptingModelRunner`` (swaps before copies before the
forward pass) ``ChunkedPrefillScheduler`` (a long prompt over several iterations),
``PreemptingScheduler`` and ``PreemptingEngine`` (FCFS over waiting / running / swapped,
all-or-nothing preemption of the newest group, chunked prefill), with the
step's ``LLM``. (The paper's Orca baselines run in this same engine, with an
admission rule of their own: ``paged.bench.reservation``.)
"""

from paged._lazy import lazy_package

# each name -> the module that defines it ("module:attribute" where the name differs)
_OWN = {
    "ChunkedPrefillScheduler": "chunked",
    "PREEMPTION_MODES": "policy:MODES",
    "PreemptingEngine": "engine",
    "PreemptingModelRunner": "runner",
    "PreemptingScheduler": "scheduler",
    "PreemptingStepPlan": "plan",
    "SwapSpace": "swap",
    "copy_between": "swap",
    "LLM": "llm",
}
__all__, __getattr__, __dir__ = lazy_package(__name__, _OWN, below="paged.step04_sharing")
