"""``LLM``: offline batch generation in vLLM's shape, over this step's ``Engine``.

    >>> from paged.step03_attention import LLM, SamplingParams
    >>> llm = LLM()        # SmolLM2-135M-Instruct once `make install` fetched it, else the demo model
    >>> out = llm.generate(["def add(a, b):"], SamplingParams(temperature=0, max_tokens=16))
    >>> out[0].outputs[0].text

vLLM's offline API as a program written for it uses it: ``generate`` takes
strings, token-id lists and prompt dicts (``prompts.py``); ``chat`` renders
conversations with the checkpoint's template; ``beam_search`` takes
``BeamSearchParams``; ``get_tokenizer`` gives a transformers-style tokenizer.
The outputs carry ``Logprob`` objects and ``RequestOutput.metrics``, and
``SamplingParams``' text keywords (``include_stop_str_in_output``,
``skip_special_tokens``, ``detokenize``, ``truncate_prompt_tokens``) are applied
here, after the engine: the engine always detokenizes one way.

Each later step subclasses this class with its own engine (``engine_class``),
so ``paged.stepNN_*.LLM`` is the engine as it stands at step NN.
"""

from __future__ import annotations

import itertools
import sys
import time
from dataclasses import replace

import torch
from tqdm.auto import tqdm

from paged.errors import RequestError
from paged.sampling.sampling_params import SamplingParams
from paged.step03_attention.engine import Engine
from paged.step03_attention.outputs import (BeamSearchOutput, BeamSearchSequence, Logprob, RequestMetrics,
                                            RequestOutput)
from paged.step03_attention.prompts import Tokenizer, as_prompt_list, split_prompt


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

    def get_tokenizer(self) -> Tokenizer:
        """The checkpoint's tokenizer with transformers' methods (``encode``, ``decode``, ``apply_chat_template``)."""
        if self.tokenizer is None:
            raise ValueError(f"{self.model_path} has no tokenizer")
        return Tokenizer(self.tokenizer, self.model.eos_token_ids, self.model.config.bos_token_id, self._renderer())

    def _renderer(self, template: str | None = None):
        from paged.models.chat_render import ChatRenderer

        template = template or self.model.chat_template
        if template is None or self.tokenizer is None:
            return None
        return ChatRenderer(self.tokenizer, template, self.model.special_tokens)

    def generate(self, prompts, sampling_params: SamplingParams | list[SamplingParams] | None = None,
                 use_tqdm: bool = True, priority: list[int] | None = None) -> list[RequestOutput]:
        """Generate for every prompt; outputs in prompt order.

        A prompt is a string, a list of token ids, or a dict (``{"prompt": ...}`` or
        ``{"prompt_token_ids": [...]}``); one prompt may be given alone. Every prompt is
        validated before any is queued, so a bad one raises ``RequestError`` and nothing runs.
        ``priority``: one per prompt (vLLM's: the smaller goes first), with
        ``scheduling_policy="priority"`` (step05); None: 0 for every prompt.
        """
        prompts = as_prompt_list(prompts)
        params = sampling_params or SamplingParams()
        params = params if isinstance(params, list) else [params] * len(prompts)
        if len(params) != len(prompts):
            raise ValueError(f"{len(prompts)} prompts but {len(params)} SamplingParams")
        priority = [0] * len(prompts) if priority is None else list(priority)
        if len(priority) != len(prompts):
            raise ValueError(f"{len(prompts)} prompts but {len(priority)} priorities")
        split = [split_prompt(p, self.encode) for p in prompts]
        texts = [text for text, _ in split]
        token_ids = [ids[-sp.truncate_prompt_tokens:] if sp.truncate_prompt_tokens else ids
                     for (_, ids), sp in zip(split, params)]
        for i, (ids, sp, rank) in enumerate(zip(token_ids, params, priority)):
            try:
                self.engine.check_request(ids, sp, rank)
            except RequestError as e:
                raise e.for_prompt(i) from None
        ids_of = []
        for text, ids, sp, rank in zip(texts, token_ids, params, priority):
            rid = f"gen-{next(self._ids)}"
            self.engine.add_request(rid, ids, sp, prompt=text, priority=rank)
            ids_of.append(rid)
        done = self._run(ids_of, use_tqdm)
        return [self._finish(done[r], sp) for r, sp in zip(ids_of, params)]

    def _run(self, ids_of: list[str], use_tqdm: bool) -> dict[str, RequestOutput]:
        """Step until every request of ``ids_of`` finished; their final outputs, each with its ``metrics``."""
        arrived = time.time()
        times: dict[str, list] = {r: [None, None, arrived] for r in ids_of}  # scheduled, first token, last token
        done: dict[str, RequestOutput] = {}
        with tqdm(total=len(ids_of), desc="generate", disable=not use_tqdm, unit="req") as bar:
            while self.engine.has_unfinished():
                started = time.time()
                outputs = self.engine.step()
                now = time.time()
                for event in self.engine.events:
                    if event.kind == "admitted" and event.request_id in times and times[event.request_id][0] is None:
                        times[event.request_id][0] = started
                for out in outputs:
                    if out.request_id not in times:
                        continue
                    t = times[out.request_id]
                    if any(c.token_ids for c in out.outputs):
                        t[1] = t[1] or now
                        t[2] = now
                    if out.finished:
                        out.metrics = RequestMetrics(arrived, t[2], t[0], t[1], t[0] - arrived if t[0] else None, now)
                        done[out.request_id] = out
                        bar.update(1)
        return done

    def _finish(self, out: RequestOutput, params: SamplingParams) -> RequestOutput:
        """vLLM's text keywords applied, each logprob's text filled in."""
        outputs = []
        for c in out.outputs:
            text = c.text
            if not params.skip_special_tokens and self.tokenizer is not None:
                text = self.tokenizer.decode(c.token_ids, skip_special_tokens=False)
                if c.finish_reason == "stop" and isinstance(c.stop_reason, str) and c.stop_reason in text:
                    text = text[:text.index(c.stop_reason)]
            if params.include_stop_str_in_output and c.finish_reason == "stop" and isinstance(c.stop_reason, str):
                text += c.stop_reason
            if not params.detokenize:
                text = ""
            outputs.append(replace(c, text=text, logprobs=self._logprobs(c.logprobs)))
        return replace(out, outputs=outputs, prompt_logprobs=self._logprobs(out.prompt_logprobs))

    def _logprobs(self, entries):
        """Each engine entry ``{token id: Logprob}`` with each token's text filled in (its rank is the engine's)."""
        if entries is None:
            return None
        decode = (lambda t: self.tokenizer.decode([t], skip_special_tokens=False)) if self.tokenizer else str
        return [None if entry is None else {t: Logprob(lp, lp.rank, decode(t))
                                            for t, lp in sorted(entry.items(), key=lambda kv: -kv[1])}
                for entry in entries]

    def chat(self, messages, sampling_params: SamplingParams | list[SamplingParams] | None = None,
             use_tqdm: bool = True, chat_template: str | None = None, add_generation_prompt: bool = True,
             continue_final_message: bool = False, tools: list[dict] | None = None,
             chat_template_kwargs: dict | None = None) -> list[RequestOutput]:
        """Generate replies to one conversation (a list of ``{"role", "content"}``) or to a list of them,
        rendered with the checkpoint's chat template (or ``chat_template``); its end-of-turn token ends a
        reply, as on the server."""
        renderer = self._renderer(chat_template)
        if renderer is None:
            raise ValueError(f"{self.model_path} has no chat template (give chat_template=...) or no tokenizer")
        conversations = [messages] if messages and isinstance(messages[0], dict) else list(messages)
        prompts = [{"prompt": text, "prompt_token_ids": ids} for text, ids in
                   (renderer.encode(c, add_generation_prompt and not continue_final_message, continue_final_message,
                                    variables=chat_template_kwargs, tools=tools) for c in conversations)]
        params = sampling_params or SamplingParams()
        stop = renderer.end_of_turn_ids
        params = [replace(p, stop_token_ids=[*p.stop_token_ids, *(t for t in stop if t not in p.stop_token_ids)])
                  for p in (params if isinstance(params, list) else [params] * len(prompts))]
        return self.generate(prompts, params, use_tqdm=use_tqdm)

    def beam_search(self, prompts, params) -> list[BeamSearchOutput]:
        """vLLM's ``LLM.beam_search``: ``params.beam_width`` beams per prompt, returned best first, each with
        the prompt's tokens then its own (``tokens``) and their text."""
        prompts = as_prompt_list(prompts)
        sp = SamplingParams(n=params.beam_width, best_of=params.beam_width, use_beam_search=True, temperature=0.0,
                            max_tokens=params.max_tokens, ignore_eos=params.ignore_eos,
                            length_penalty=params.length_penalty, logprobs=0)
        results = []
        for out in self.generate(prompts, sp, use_tqdm=False):
            prompt_text = out.prompt or ""
            results.append(BeamSearchOutput([BeamSearchSequence(
                tokens=out.prompt_token_ids + c.token_ids, logprobs=c.logprobs or [],
                cum_logprob=c.cumulative_logprob or 0.0, text=prompt_text + c.text, finish_reason=c.finish_reason,
                stop_reason=c.stop_reason) for c in out.outputs]))
        return results
