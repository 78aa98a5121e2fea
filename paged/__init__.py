"""paged: PagedAttention, layer by layer — a teaching implementation of vLLM that is also an engine.

``from paged import LLM, SamplingParams`` gives the most complete engine of the
ladder; ``paged.stepNN_*.LLM`` gives the engine as it stands at step NN.
"""

from paged.step05_preemption import LLM, CompletionOutput, RequestOutput, SamplingParams

__all__ = ["LLM", "SamplingParams", "RequestOutput", "CompletionOutput"]
