"""paged: PagedAttention, layer by layer — a teaching implementation of vLLM that is also an engine.

``from paged import LLM, SamplingParams`` gives the most complete engine of the
ladder (step06: ``tensor_parallel_size=1`` by default, no worker process then);
``paged.stepNN_*.LLM`` gives the engine as it stands at step NN. A request
the engine refuses raises ``RequestError`` (a ``ValueError`` naming the field).
"""

from paged.step06_tensor_parallel import LLM, CompletionOutput, RequestError, RequestOutput, SamplingParams

__all__ = ["LLM", "SamplingParams", "RequestOutput", "CompletionOutput", "RequestError"]
