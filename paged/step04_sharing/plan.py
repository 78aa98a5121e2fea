"""``SharingStepPlan``: step03's ``StepPlan`` plus the prompts that fork this iteration (paper 4.4).

Plain data, like the plan it extends, so the scheduler that fills it needs no tensor.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from paged.step03_attention.plan import StepPlan


@dataclass
class SharingStepPlan(StepPlan):
    """``StepPlan`` plus ``fanout``: ``(seq that computed the row, child seq, child seed)``."""

    fanout: list[tuple[int, int, int]] = field(default_factory=list)
