"""Greedy outputs of the engine equal transformers', token for token, on one device.

Not a benchmark itself (no ``run``): ``engine_gpu`` runs it first.

The bundled demo model (``paged.demo``: a trained 6-layer LLaMA, so its top
logits are far apart and float32 reordering cannot flip an argmax) in float32,
the same random prompts through ``paged.LLM`` (its default engine: prefix
caching and preemption on) and through ``transformers``' ``generate`` (one
prompt at a time, so no padding), both greedy, both stopping at the model's
EOS (kept in the output) or after ``max_tokens``. Equal means the same token
list for every prompt; the first difference is reported otherwise.
"""

from __future__ import annotations

import random

import torch


def compare(device: str, num_prompts: int, max_tokens: int, seed: int = 0,
            attention_backend: str | None = None) -> dict:
    """``{"equal", "prompts", "tokens", "first_difference"}``: the engine's greedy tokens against transformers'."""
    import transformers

    from paged import LLM, SamplingParams
    from paged.demo import DEFAULT_MODEL_PATH
    from paged.models.random_llama import quiet_transformers

    quiet_transformers()
    rng = random.Random(seed)
    llm = LLM(model=str(DEFAULT_MODEL_PATH), dtype="float32", device=device, attention_backend=attention_backend)
    vocab = llm.model.config.vocab_size
    prompts = [[rng.randrange(3, vocab) for _ in range(rng.randint(4, 40))] for _ in range(num_prompts)]
    ours = [o.outputs[0].token_ids for o in
            llm.generate(prompts, SamplingParams(temperature=0, max_tokens=max_tokens), use_tqdm=False)]
    del llm
    hf = transformers.AutoModelForCausalLM.from_pretrained(DEFAULT_MODEL_PATH, dtype=torch.float32).to(device).eval()
    theirs = []
    with torch.inference_mode():
        for p in prompts:
            ids = torch.tensor([p], device=device)
            out = hf.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_tokens,
                              do_sample=False, pad_token_id=hf.generation_config.pad_token_id)
            theirs.append(out[0, len(p):].tolist())
    first = next(({"prompt": i, "position": next((j for j, (a, b) in enumerate(zip(x, y)) if a != b),
                                                  min(len(x), len(y))), "paged": x, "transformers": y}
                  for i, (x, y) in enumerate(zip(ours, theirs)) if list(x) != list(y)), None)
    return {"equal": first is None, "prompts": num_prompts, "tokens": sum(len(x) for x in ours),
            "first_difference": first, "transformers": transformers.__version__}
