"""Step 03 — PagedAttention and iteration-level batching (paper §4.1, §4.5).

Adds: the attention paths (reference gather + SDPA, block-wise online softmax,
the native kernels behind one dispatch), ``StepPlan`` and ``ModelRunner``
(the scheduler/worker split: docs/architecture.md), the ``Scheduler`` (it owns the queues,
the block pool and the budgets; FCFS, no preemption) and the first ``Engine``
(the scheduler, a runner and the outputs; ``EngineEvent`` records its decisions) and the
vLLM-shaped ``LLM`` / ``SamplingParams`` API (sampling itself lies below the ladder, in ``paged.sampling``).
"""

from paged._lazy import lazy_package

# each name -> the module that defines it ("module:attribute" where the name differs)
_OWN = {
    "AttentionMetadata": "attention",
    "BACKENDS": "backends",
    "CompletionOutput": "outputs",
    "EVENT_KINDS": "events",
    "Engine": "engine",
    "EngineEvent": "events",
    "LLM": "llm",
    "ModelRunner": "runner",
    "PagedAttention": "attention",
    "RequestError": "paged.errors",
    "RequestOutput": "outputs",
    "Reservation": "scheduler",
    "SampleResult": "paged.sampling.result",
    "SamplingParams": "paged.sampling.sampling_params",
    "Scheduler": "scheduler",
    "StepPlan": "plan",
    "blockwise_attention": "blockwise",
    "causal_sdpa": "reference",
    "gather_blocks": "reference",
    "prefill_attention": "backends",
    "reference_attention": "reference",
    "resolve_backend": "backends",
    "sample": "paged.sampling.sampler",
}
__all__, __getattr__, __dir__ = lazy_package(__name__, _OWN, below="paged.step02_block_table")
