"""``PreemptingStepPlan``: step04's plan plus the blocks that move between device and host (paper 4.5).

Plain data, like the plans it extends. The runner executes the moves before the forward pass,
swap-outs first (their device blocks may be handed to a swap-in of the same iteration), then
swap-ins, then step04's copies.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from paged.step04_sharing.plan import SharingStepPlan


@dataclass
class PreemptingStepPlan(SharingStepPlan):
    """``SharingStepPlan`` plus ``blocks_to_swap_out`` ``[(device, host)]`` and
    ``blocks_to_swap_in`` ``[(host, device)]``."""

    blocks_to_swap_out: list[tuple[int, int]] = field(default_factory=list)  # (device, host)
    blocks_to_swap_in: list[tuple[int, int]] = field(default_factory=list)  # (host, device)

    @property
    def has_memory_ops(self) -> bool:
        return bool(self.blocks_to_copy or self.blocks_to_swap_out or self.blocks_to_swap_in)
