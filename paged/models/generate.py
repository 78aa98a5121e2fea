"""``greedy_generate``: batched greedy decoding over ``ContiguousAttention``.

The reference generation loop of step02: every step packs the new tokens of
all unfinished sequences into one forward pass (the whole prompt on the first
step, one token per sequence after), samples the argmax of the last row of
each sequence, and drops a sequence when it emits an EOS id or reaches
``max_new_tokens``. Later steps' engines must produce the same tokens.
"""

from __future__ import annotations

import torch

from paged.models.base import CausalLM
from paged.models.contiguous import ContiguousAttention


@torch.inference_mode()
def greedy_generate(
    model: CausalLM,
    prompts: list[list[int]],
    max_new_tokens: int,
    eos_token_ids: list[int] | None = None,
) -> list[list[int]]:
    """Greedy continuation of each prompt.

    Args:
        model: a ``CausalLM``.
        prompts: token ids per sequence, each non-empty.
        max_new_tokens: tokens to generate per sequence at most.
        eos_token_ids: ids that end a sequence (the EOS token is kept in its output); None never stops early.

    Returns:
        the generated ids of each prompt (without the prompt), in prompt order.

    Raises:
        ValueError: an empty prompt, an id outside the vocabulary, a negative ``max_new_tokens``, or a
            prompt + output longer than ``model.config.max_position_embeddings`` (nothing runs). Sliding
            windows are masked here (``ContiguousAttention``), so this reference runs past the engine's
            ``max_model_len``.
    """
    cfg = model.config
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
    for i, p in enumerate(prompts):
        if not p:
            raise ValueError(f"prompt {i} is empty")
        if min(p) < 0 or max(p) >= cfg.vocab_size:
            raise ValueError(f"prompt {i} has a token id outside [0, {cfg.vocab_size})")
        if len(p) + max_new_tokens > cfg.max_position_embeddings:
            raise ValueError(f"prompt {i}: {len(p)} + {max_new_tokens} tokens exceed the model's "
                             f"{cfg.max_position_embeddings} positions (max_position_embeddings)")
    device = next(model.parameters()).device
    eos = set(eos_token_ids or ())
    outputs: list[list[int]] = [[] for _ in prompts]
    attention = ContiguousAttention(cfg.num_layers)
    active = list(range(len(prompts))) if max_new_tokens else []
    new_tokens = {i: list(p) for i, p in enumerate(prompts)}
    while active:
        lens = [len(new_tokens[i]) for i in active]
        ids = torch.tensor([t for i in active for t in new_tokens[i]], device=device)  # [T]
        positions = torch.tensor(
            [len(prompts[i]) + len(outputs[i]) - n + j for i, n in zip(active, lens) for j in range(n)],
            device=device,
        )  # [T]
        attention.begin(active, lens)
        hidden = model(ids, positions, attention)  # [T, hidden]
        last = torch.tensor(lens, device=device).cumsum(0) - 1  # [S] last row of each sequence
        next_ids = model.compute_logits(hidden[last]).argmax(-1).tolist()  # [S]
        still = []
        for i, tok in zip(active, next_ids):
            outputs[i].append(tok)
            new_tokens[i] = [tok]
            if tok in eos or len(outputs[i]) == max_new_tokens:
                attention.free(i)
            else:
                still.append(i)
        active = still
    return outputs
