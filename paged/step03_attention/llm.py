"""``LLM``: offline batch generation in vLLM's shape, over this step's ``Engine``.

    >>> from paged.step03_attention import LLM, SamplingParams
    >>> llm = LLM()        # SmolLM2-135M-Instruct once `make install` fetched it, else the demo model
    >>> out = llm.generate(["def add(a, b):"], SamplingParams(temperature=0, max_tokens=16))
    >>> out[0].outputs[0].text

Each later step subclasses this class with its own engine (``engine_class``),
so ``paged.stepNN_*.LLM`` is the engine as it stands at step NN.
"""

from __future__ import annotations

import itertools
import sys

import torch
from tqdm.auto import tqdm

from paged.step03_attention.engine import Engine
from paged.errors import RequestError
from paged.step03_attention.outputs import RequestOutput
from paged.sampling.sampling_params import SamplingParams


def default_model_path() -> str:
    """SmolLM2-135M-Instruct when fetched (``paged.models.default``), else the bundled demo model; says which."""
    from paged.models.default import default_model

    path, name = default_model()
    print(f"paged: no model given, using {name} ({path})", file=sys.stderr)
    return path


class LLM:
    """A model plus an engine, for generating from a list of prompts.

    Args:
        model: a Hugging Face checkpoint folder or a GGUF file; default: SmolLM2-135M-Instruct when
            ``make install`` fetched it, else the bundled demo model.
        dtype: ``"auto"`` (the checkpoint's), ``"float32"``, ``"bfloat16"``,
            ``"float16"`` or ``"float64"``.
        device: ``"cpu"`` or ``"cuda"``.
        quantization: None, or ``"gguf"``: a GGUF model's linear layers multiply by the file's
            quantized blocks in a C++ kernel instead of dense weights (``paged.models.quantized``).
        **engine_args (Any): passed to the engine (``block_size``, ``num_blocks``,
            ``kv_cache_memory``, ``max_num_seqs``, ``max_model_len``, ``seed``, ...).
    """

    engine_class = Engine

    def __init__(self, model: str | None = None, dtype: str | torch.dtype = "auto",
                 device: str = "cpu", quantization: str | None = None, **engine_args) -> None:
        self.model_path = model or default_model_path()
        self.quantization = quantization
        self.model = self._load_model(dtype, device)
        self.tokenizer = self.model.tokenizer
        self.engine = self.engine_class(self.model, **engine_args)
        self._ids = itertools.count()

    def _load_model(self, dtype, device):
        """The ``LoadedModel`` the engine runs (step06 loads one shard per process instead)."""
        from paged.models import load_model

        return load_model(self.model_path, dtype=dtype, device=device, quantization=self.quantization)

    def encode(self, prompt: str) -> list[int]:
        if self.tokenizer is None:
            raise ValueError(f"{self.model_path} has no tokenizer.json: pass token id lists instead")
        return self.tokenizer.encode(prompt).ids

    def generate(
        self,
        prompts: str | list[str] | list[list[int]],
        sampling_params: SamplingParams | list[SamplingParams] | None = None,
        use_tqdm: bool = True,
    ) -> list[RequestOutput]:
        """Generate for every prompt (strings or token-id lists); outputs in prompt order.

        Every prompt is validated before any is queued, so a bad one raises
        ``RequestError`` and nothing runs.
        """
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        params = sampling_params or SamplingParams()
        params = params if isinstance(params, list) else [params] * len(prompts)
        if len(params) != len(prompts):
            raise ValueError(f"{len(prompts)} prompts but {len(params)} SamplingParams")
        token_ids = [self.encode(p) if isinstance(p, str) else list(p) for p in prompts]
        for i, (ids, sp) in enumerate(zip(token_ids, params)):
            try:
                self.engine.check_request(ids, sp)
            except RequestError as e:
                raise e.for_prompt(i) from None
        ids_of = []
        for p, ids, sp in zip(prompts, token_ids, params):
            rid = f"gen-{next(self._ids)}"
            self.engine.add_request(rid, ids, sp, prompt=p if isinstance(p, str) else None)
            ids_of.append(rid)
        done: dict[str, RequestOutput] = {}
        with tqdm(total=len(ids_of), desc="generate", disable=not use_tqdm, unit="req") as bar:
            while self.engine.has_unfinished():
                for out in self.engine.step():
                    if out.finished:
                        done[out.request_id] = out
                        bar.update(1)
        return [done[r] for r in ids_of]
