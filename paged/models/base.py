"""``CausalLM``: what every model in ``paged.models`` promises to the runner and the loader.

The runner calls ``prepare_for_serving(batch_invariant)`` once, when serving
starts (the model makes its serving-time choices itself and says what the
runner must know: ``ServingTraits``), then ``forward(input_ids, positions,
attention)`` once per iteration over every new token of every sequence,
packed (docs/architecture.md, StepPlan), then ``compute_logits`` on the rows
it samples from. The loader asks
``checkpoint_layout()`` which Hugging Face tensors fill which parameter:
module and parameter names follow Hugging Face's, except the fused
projections listed in ``packed_modules`` (e.g. ``qkv_proj`` <- ``q_proj``,
``k_proj``, ``v_proj``), which are filled part by part.
"""

from __future__ import annotations

import dataclasses

import torch
from torch import nn

from paged.models.attention import Attention
from paged.models.config import ModelConfig
from paged.models.layers import (
    MergedLinear,
    RotaryEmbedding,
    fixed_order_rows,
    pack_pair_order_linears,
    prepack_linears,
    return_freed_memory,
    use_fixed_order_linears,
)
from paged.models.quantized import QuantizedLinear, pack_lane_linears


@dataclasses.dataclass(frozen=True)
class ServingTraits:
    """What a model made ready to serve reports (``CausalLM.prepare_for_serving``).

    Attributes:
        padded_linears: how many dense linears multiply a lone row as two (batch-invariant mode:
            ``layers.gemm``); quantized layers need not, their kernel sums a row the same way at any
            row count.
        packed_linears: how many linears multiply by a oneDNN-packed weight (``prepack_linears``).
        fixed_order_linears: how many dense linears multiply by a fixed-order kernel instead of
            the stock GEMM (where ``layers.use_fixed_order_linears`` says so).
        pair_order_linears: how many of those multiply in the pair order (``layers.pack_pair_order_linears``).
        lane_linears: how many quantized linears multiply by their blocks in the lanes layout
            (``quantized.pack_lane_linears``).
    """

    padded_linears: int
    packed_linears: int
    fixed_order_linears: int = 0
    pair_order_linears: int = 0
    lane_linears: int = 0


class CausalLM(nn.Module):
    """Base of the decoder-only models: a ``model`` trunk and an ``lm_head``.

    Class attributes:
        packed_modules: fused module name -> the Hugging Face modules stacked in it, in output order.
        tp_plan: module name -> ``"column"`` or ``"row"``: how a tensor-parallel step shards it
            (column-parallel parts are split per part of a ``MergedLinear``).
    """

    packed_modules: dict[str, tuple[str, ...]] = {}
    tp_plan: dict[str, str] = {}
    unrolled = None  # the forward pass as one loop of kernel calls, where prepare_for_serving made one (unrolled.py)

    config: ModelConfig
    model: nn.Module
    lm_head: nn.Linear

    def forward(
        self,
        input_ids: torch.Tensor,  # [T] int64, new tokens of all sequences packed
        positions: torch.Tensor,  # [T] int64, each token's position in its own sequence
        attention: Attention,
    ) -> torch.Tensor:  # [T, hidden]
        """Hidden states after the last layer (and final norm) for every new token."""
        if self.unrolled is not None and self.unrolled.applies():  # the same calls, chosen once (unrolled.py)
            return self.unrolled(input_ids, positions, attention)
        return self.model(input_ids, positions, attention)

    def unroll(self):
        """The forward pass as one loop of the kernel calls its modules make (``paged.models.unrolled``), for
        a model made ready to serve; None where the model has none (this default) or it does not apply."""
        return None

    def prepare_for_serving(self, batch_invariant: bool = False) -> ServingTraits:
        """Make the serving-time choices once, when the weights are final (the runner calls it before its
        first step; only inference runs afterwards).

        In batch-invariant mode every linear gives a row the same bits whatever the row count: quantized
        linears run only their kernel, dense ones multiply a lone row as two (``layers.gemm``), or run a
        fixed-order kernel (``layers.use_fixed_order_linears``: float32 ones, and bfloat16 ones on a CPU
        without a bfloat16 GEMM or, in the pair order, with AVX512_BF16 and no AMX; it is also the faster one
        there, so it runs with the mode off too: in float32 for calls of up to
        ``layers.FLOAT32_FIXED_ORDER_ROWS`` rows); otherwise
        quantized linears hand batches of many rows to their dense layer, which multiplies as the dense
        linears do (in float32 by the fixed-order kernel up to that many rows; never padded). Other
        bfloat16 CPU linears get oneDNN-packed weights (the same bits), pair-order ones their weight
        laid out for that kernel (``layers.pack_pair_order_linears``), quantized ones their blocks in the
        lanes layout where the AVX2 loops are built (``quantized.pack_lane_linears``). A quantized layer
        whose dense layer will not run lets it go first (``QuantizedLinear.use_kernel_only``), so nothing is
        laid out for it, and the memory freed goes back to the system (``layers.return_freed_memory``).

        Args:
            batch_invariant: a row's result must not depend on the batch it is in.
        """
        quantized = [m for m in self.modules() if isinstance(m, QuantizedLinear)]
        tied = self.get_input_embeddings().weight if self.config.tie_word_embeddings else None
        for layer in quantized:  # a tied LM head's dense layer, if it needs one, is the embedding's weight
            layer.use_kernel_only(batch_invariant, tied if layer is self.lm_head else None)
        inside = {id(q.dense) for q in quantized if q.dense is not None}  # a dense fallback: never padded
        padded = fixed = 0
        for module in self.modules():  # every dense GEMM (``layers.gemm``), tensor-parallel shards included
            if not hasattr(module, "pad_one_row"):
                continue
            module.fixed_order = use_fixed_order_linears(module.weight, batch_invariant)
            module.fixed_order_rows = fixed_order_rows(module.weight, batch_invariant)
            if id(module) in inside:  # runs only with the mode off, for batches of many rows
                continue
            module.pad_one_row = batch_invariant and not module.fixed_order
            padded += module.pad_one_row
            fixed += module.fixed_order
        return_freed_memory()  # what loading and the quantized layers let go, before the lay-outs below take more
        traits = ServingTraits(padded_linears=padded, packed_linears=prepack_linears(self), fixed_order_linears=fixed,
                               pair_order_linears=pack_pair_order_linears(self), lane_linears=pack_lane_linears(self))
        return_freed_memory()  # the row layouts the lanes replaced
        self.unrolled = self.unroll()  # after every choice above: it reads them
        return traits

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:  # [T', hidden] -> [T', V]
        """Logits of the rows to sample from (call it on those rows only: the LM head is the widest GEMM)."""
        return self.lm_head(hidden)

    def materialise(self, dtype: torch.dtype, device: str | torch.device) -> CausalLM:
        """Give the tensors still on the meta device (all of them, for a model just built there)
        uninitialised memory on ``device``, floating-point ones in ``dtype``; the embeddings are tied
        again. Returns ``self``.

        For a model built on the meta device, what ``to(dtype).to_empty(device=device)`` does, by
        ``torch.empty`` of each shape: ``to_empty`` calls ``torch.empty_like`` of a meta tensor, whose
        first call imports sympy (0.3 s of a start-up).
        """
        def empty(t: torch.Tensor) -> torch.Tensor:
            if not t.is_meta:
                return t
            return torch.empty(t.shape, dtype=dtype if t.is_floating_point() else t.dtype, device=device)

        self._apply(empty)
        self.tie_weights()
        return self

    def tie_weights(self) -> None:
        """Share the token embedding with the LM head when the config says so (again after ``materialise``,
        which gives every module its own fresh tensor). A quantized LM head reads the embedding's blocks
        instead (``prepare_for_serving`` gives its dense layer, if it needs one, the embedding's weight)."""
        if self.config.tie_word_embeddings and not isinstance(self.lm_head, QuantizedLinear):
            self.lm_head.weight = self.get_input_embeddings().weight

    def get_input_embeddings(self) -> nn.Embedding:
        """The token embedding module."""
        raise NotImplementedError

    def reset_buffers(self) -> None:
        """Recompute non-persistent buffers (RoPE tables) in the dtype of the weights."""
        dtype = next(self.parameters()).dtype
        for module in self.modules():
            if isinstance(module, RotaryEmbedding):
                module.reset_table(dtype)

    def checkpoint_layout(self) -> dict[str, list[tuple[str, int, int]]]:
        """Which checkpoint tensor fills which rows of which parameter.

        Returns:
            parameter name -> list of ``(checkpoint name, first row, row count)``; a plain parameter has
            one entry covering all of it, a ``MergedLinear`` weight or bias one entry per part.
        """
        layout = {}
        modules = dict(self.named_modules())
        for name, param in self.named_parameters():  # tied parameters appear once
            module_name, _, leaf = name.rpartition(".")
            prefix, _, short = module_name.rpartition(".")
            module = modules[module_name]
            if isinstance(module, MergedLinear) and short in self.packed_modules:
                parts, row = [], 0
                for part, size in zip(self.packed_modules[short], module.output_sizes):
                    parts.append((f"{prefix}.{part}.{leaf}", row, size))
                    row += size
                layout[name] = parts
            else:
                layout[name] = [(name, 0, param.shape[0] if param.dim() else 1)]
        return layout
