"""Step 05 — scheduling under memory pressure: gang preemption, swap and recompute (paper §4.5).

Adds components for step03's scheduler loop: ``Preemption`` (eviction by swap
or recompute, the swap-or-recompute ``policy``), ``SwappingKVManager`` (the host block
pool and the block moves), ``ChunkedPrefill`` (a long prompt over several
iterations) and two orders: ``FairShare`` (across clients, the least-served first: the
server's) and ``PriorityFirst`` (each request's own ``priority``, vLLM's);
``PreemptingModelRunner`` (the host memory; swaps before copies before
the forward pass) and ``PreemptingEngine`` (FCFS over waiting / running / swapped,
fair share or priorities; all-or-nothing preemption of the newest group, chunked prefill), with the step's
``LLM``. (The paper's Orca baselines run in this same engine, with an
admission rule of their own: ``paged.bench.reservation``.)
"""

from paged._lazy import lazy_package

# each name -> the module that defines it ("module:attribute" where the name differs)
_OWN = {
    "ChunkedPrefill": "chunked",
    "FairShare": "fair",
    "PREEMPTION_MODES": "policy:MODES",
    "PreemptingEngine": "engine",
    "PreemptingModelRunner": "runner",
    "PriorityFirst": "priority",
    "Preemption": "policy",
    "SwappingKVManager": "kv_manager",
    "copy_between": "runner",
    "LLM": "llm",
}
__all__, __getattr__, __dir__ = lazy_package(__name__, _OWN, below="paged.step04_sharing")
