"""Step 03 — PagedAttention and iteration-level batching (paper §4.1, §4.5).

Adds: the attention paths (reference gather + SDPA, block-wise online softmax,
the native kernels behind one dispatch), ``StepPlan`` and ``ModelRunner``
(the scheduler/worker split: docs/architecture.md), the ``Scheduler`` (it owns the queues,
the block pool and the budgets; FCFS, no preemption) and the first ``Engine``
(the scheduler, a runner and the outputs; ``EngineEvent`` records its decisions) and the
vLLM-shaped ``LLM`` / ``SamplingParams`` API (sampling itself lies below the ladder, in ``paged.sampling``).
"""

from paged.step02_block_table import *  # noqa: F401,F403  (the ladder: re-export step02)
from paged.step02_block_table import __all__ as _step02_all
from paged.step03_attention.attention import AttentionMetadata, PagedAttention
from paged.step03_attention.backends import BACKENDS, prefill_attention, resolve_backend
from paged.step03_attention.blockwise import blockwise_attention
from paged.step03_attention.engine import Engine
from paged.errors import RequestError
from paged.step03_attention.events import EVENT_KINDS, EngineEvent
from paged.step03_attention.llm import LLM
from paged.step03_attention.outputs import CompletionOutput, RequestOutput
from paged.step03_attention.plan import StepPlan
from paged.step03_attention.reference import causal_sdpa, gather_blocks, reference_attention
from paged.step03_attention.runner import ModelRunner
from paged.sampling.sampler import SampleResult, sample
from paged.sampling.sampling_params import SamplingParams
from paged.step03_attention.scheduler import Reservation, Scheduler

__all__ = list(_step02_all) + [
    "AttentionMetadata",
    "BACKENDS",
    "CompletionOutput",
    "EVENT_KINDS",
    "Engine",
    "EngineEvent",
    "LLM",
    "ModelRunner",
    "PagedAttention",
    "RequestError",
    "RequestOutput",
    "Reservation",
    "SampleResult",
    "SamplingParams",
    "Scheduler",
    "StepPlan",
    "blockwise_attention",
    "causal_sdpa",
    "gather_blocks",
    "prefill_attention",
    "reference_attention",
    "resolve_backend",
    "sample",
]
