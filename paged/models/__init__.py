"""Model definitions with pluggable attention and a Hugging Face checkpoint loader.

``LlamaForCausalLM`` (Llama, Mistral, Qwen2, Qwen3), ``Phi3ForCausalLM``,
``GemmaForCausalLM`` (Gemma 2, Gemma 3 text) and ``OPTForCausalLM`` run one
forward pass over the packed new tokens of a whole batch and call an
``Attention`` object for the KV cache; ``ContiguousAttention`` and
``greedy_generate`` are the step02-era contiguous path they are tested with;
``load_model`` reads a checkpoint folder.
"""

from paged.models.attention import Attention
from paged.models.base import CausalLM
from paged.models.config import ModelConfig, ModelLoadError
from paged.models.contiguous import ContiguousAttention
from paged.models.gemma import GemmaForCausalLM
from paged.models.generate import greedy_generate
from paged.models.llama import LlamaForCausalLM, Phi3ForCausalLM
from paged.models.loader import LoadedModel, load_model, read_config
from paged.models.opt import OPTForCausalLM

__all__ = [
    "Attention",
    "CausalLM",
    "ContiguousAttention",
    "GemmaForCausalLM",
    "LlamaForCausalLM",
    "LoadedModel",
    "ModelConfig",
    "ModelLoadError",
    "OPTForCausalLM",
    "Phi3ForCausalLM",
    "greedy_generate",
    "load_model",
    "read_config",
]
