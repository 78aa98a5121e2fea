"""paged: PagedAttention, layer by layer — a teaching implementation of vLLM that is also an engine.

``from paged import LLM, SamplingParams`` gives the most complete engine of the
ladder (step06: ``tensor_parallel_size=1`` by default, no worker process then);
``paged.stepNN_*.LLM`` gives the engine as it stands at step NN. A request
the engine refuses raises ``RequestError`` (a ``ValueError`` naming the field).
"""

from paged import _openmp
from paged._lazy import lazy_package

_openmp.apply()  # before any torch import of ours: libgomp reads OMP_WAIT_POLICY once, when torch loads it

# from step06, on first use: ``import paged.step03_attention.scheduler`` loads no model and no torch
_OWN = {name: "paged.step06_tensor_parallel" for name in
        ("LLM", "SamplingParams", "RequestOutput", "CompletionOutput", "RequestError", "StructuredOutputsParams",
         "GuidedDecodingParams", "TokensPrompt", "TextPrompt", "BeamSearchParams", "BeamSearchOutput", "Logprob",
         "RequestMetrics")}
__all__, __getattr__, __dir__ = lazy_package(__name__, _OWN)
