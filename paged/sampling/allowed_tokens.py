"""``SamplingParams.allowed_token_ids`` as a logits processor (vLLM's keyword): only those tokens may be drawn.

``SamplingParams`` puts an ``AllowedTokens`` first among the request's logits
processors, so it runs where any logits processor runs (``sampler.py``: on a
copy of the request's row, before the penalties), and a token id outside the
vocabulary fails that request alone.
"""

from __future__ import annotations

from paged.errors import RequestError


class AllowedTokens:
    """``SamplingParams.allowed_token_ids`` as a logits processor: every other token's logit is ``-inf``.

    Args:
        token_ids: the tokens that may be drawn; one outside the row's vocabulary fails the request.
    """

    def __init__(self, token_ids: list[int]) -> None:
        self.token_ids = sorted(set(token_ids))
        self.index = None  # the ids as a tensor on the logits' device, made at the first call

    def __call__(self, output_token_ids: list[int], logits):  # logits: [V]
        import torch

        if self.token_ids[-1] >= logits.shape[-1]:
            raise RequestError(f"allowed_token_ids holds {self.token_ids[-1]}, outside the vocabulary of "
                               f"{logits.shape[-1]} tokens", param="allowed_token_ids")
        if self.index is None or self.index.device != logits.device:
            self.index = torch.tensor(self.token_ids, device=logits.device)
        masked = torch.full_like(logits, float("-inf"))
        masked[self.index] = logits[self.index]
        return masked
