"""Step 03 — PagedAttention and iteration-level batching (paper §4.1, §4.5).

Adds: the attention paths (reference gather + SDPA, block-wise online softmax,
the native kernels behind one dispatch), ``StepPlan`` and ``ModelRunner``
(the scheduler/worker split: docs/architecture.md), the ``Scheduler`` (one loop, written
once: it owns the queues and the budgets, and holds one component per idea — the
``KVManager``, the one owner of blocks and tables, and the ``policies``: ``WholePrompt``
chunking, ``EndRequest`` eviction, ``Reservation`` admission, ``OneSequence`` decoding,
``FirstComeFirstServed`` order; no preemption) and the first ``Engine``
(the scheduler, a runner and the outputs; ``EngineEvent`` records its decisions) and the
vLLM-shaped ``LLM`` / ``SamplingParams`` API (sampling itself lies below the ladder, in ``paged.sampling``).
"""

from paged._lazy import lazy_package

# each name -> the module that defines it ("module:attribute" where the name differs)
_OWN = {
    "AttentionMetadata": "attention",
    "BACKENDS": "backends",
    "BeamSearchOutput": "outputs",
    "BeamSearchParams": "prompts",
    "BeamSearchSequence": "outputs",
    "CompletionOutput": "outputs",
    "EVENT_KINDS": "events",
    "Engine": "engine",
    "EndRequest": "policies",
    "EngineEvent": "events",
    "FirstComeFirstServed": "policies",
    "GuidedDecodingParams": "paged.sampling.structured",
    "KVManager": "kv_manager",
    "LLM": "llm",
    "Logprob": "outputs",
    "ModelRunner": "runner",
    "OneSequence": "policies",
    "PagedAttention": "attention",
    "RequestError": "paged.errors",
    "RequestMetrics": "outputs",
    "RequestOutput": "outputs",
    "Reservation": "policies",
    "SampleResult": "paged.sampling.result",
    "SamplingParams": "paged.sampling.sampling_params",
    "Scheduler": "scheduler",
    "StepPlan": "plan",
    "StructuredOutputsParams": "paged.sampling.structured",
    "TextPrompt": "prompts",
    "Tokenizer": "prompts",
    "TokensPrompt": "prompts",
    "WholePrompt": "policies",
    "blockwise_attention": "blockwise",
    "causal_sdpa": "reference",
    "gather_blocks": "reference",
    "prefill_attention": "backends",
    "reference_attention": "reference",
    "resolve_backend": "backends",
    "sample": "paged.sampling.sampler",
}
__all__, __getattr__, __dir__ = lazy_package(__name__, _OWN, below="paged.step02_block_table")
