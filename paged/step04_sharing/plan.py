"""``SharingStepPlan``: step03's ``StepPlan`` plus this iteration's block copies and forks (paper 4.4).

Plain data, like the plan it extends, so the scheduler that fills it needs no tensor.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from paged.step03_attention.plan import StepPlan


@dataclass
class SharingStepPlan(StepPlan):
    """``StepPlan`` plus the two things sharing brings to an iteration.

    ``blocks_to_copy``: ``(src, dst)`` block pairs, copy-on-write, executed before the forward
    pass. ``fanout``: ``(seq that computed the row, child seq, child seed)``, a prompt computed
    once whose first token row is sampled for every sequence of its group.
    """

    blocks_to_copy: list[tuple[int, int]] = field(default_factory=list)
    fanout: list[tuple[int, int, int]] = field(default_factory=list)

    @property
    def has_memory_ops(self) -> bool:
        return bool(self.blocks_to_copy)
