"""Eviction by preemption: which recovery a victim group gets, swap or recompute (paper §4.5, §7.3).

``Preemption`` is the eviction component of step05's scheduler (step03's,
``policies.EndRequest``, ends the victim). The scheduler's loop picks the
victim (the newest running group) and carries out the answer; this module only
decides. ``preemption_mode``:

* ``"swap"`` — move the group's blocks to the host pool; if the pool cannot
  take them, recompute instead (never abort).
* ``"recompute"`` — drop the blocks; on resume, prompt and generated tokens go
  through one prefill pass again.
* ``"auto"`` — per victim, by estimated cost:

  - a group of several live sequences (parallel samples, beams) shares blocks;
    recomputing would redo each sequence separately and lose the sharing, so
    it is swapped whenever the host pool has room;
  - otherwise recompute when ``tokens x recompute_s_per_token`` is below
    ``2 x blocks x swap_s_per_block`` (out and back in), else swap.

  The two unit costs are estimates for the device: recomputing a token costs
  about ``2 x parameters`` FLOPs, moving a block ``bytes_per_block`` bytes each
  way. Defaults per device type are below; ``python -m paged.bench preemption``
  measures the real crossover on a machine.

A group alone on the device that still does not fit can never continue: it is
ended (``length``), not swapped out and in forever.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

logger = logging.getLogger("paged")

MODES = ("swap", "recompute", "auto")

# Rough sustained rates (FLOP/s, bytes/s) used only to rank the two choices.
RATES = {
    "cpu": (5e10, 5e9),  # a few cores of AVX-512; a host memcpy
    "cuda": (1e14, 2.5e10),  # a data-center GPU; PCIe 4 pinned copies
}


# --8<-- [start:choose]
def choose(mode: str, num_live_seqs: int, tokens: int, blocks: int, host_free: int,
           num_params: int, bytes_per_block: int, device_type: str) -> str:
    """``"swap"`` or ``"recompute"`` for one victim group (see the module rules)."""
    can_swap = blocks <= host_free
    if mode == "recompute" or not can_swap:
        return "recompute"
    if mode == "swap" or num_live_seqs > 1:
        return "swap"
    flops, bandwidth = RATES.get(device_type, RATES["cpu"])
    recompute_s = tokens * 2 * num_params / flops
    swap_s = 2 * blocks * bytes_per_block / bandwidth
    return "recompute" if recompute_s < swap_s else "swap"
# --8<-- [end:choose]


@dataclass(frozen=True)
class Cost:
    """What ``choose`` ranks swap against recompute by: the model's size, a block's bytes, the device."""

    num_params: int = 1
    bytes_per_block: int = 1
    device_type: str = "cpu"


# --8<-- [start:preemption]
class Preemption:
    """Eviction, step05: preempt the victim by swap or recompute (``choose``), unless it is alone
    on the device and still does not fit: then it outgrew the whole pool and ends.

    Args:
        mode: ``"swap"``, ``"recompute"`` or ``"auto"``.
        cost: the sizes ``choose`` weighs in ``"auto"`` mode.
    """

    def __init__(self, mode: str = "auto", cost: Cost = Cost()) -> None:
        if mode not in MODES:
            raise ValueError(f"preemption_mode must be one of {MODES}, got {mode!r}")
        self.mode, self.cost = mode, cost

    def choose(self, req, *, alone: bool, kv) -> str:
        """``"swap"``, ``"recompute"``, or ``"length"`` (end it) for the victim ``req``."""
        if alone:
            logger.warning("request %s needs more KV blocks than the cache has (%d); ending it",
                           req.request_id, kv.num_blocks)
            return "length"
        live = req.live_seqs
        return choose(self.mode, len(live), sum(s.num_tokens for s in live), kv.distinct_blocks(live),
                      kv.host.num_free, self.cost.num_params, self.cost.bytes_per_block, self.cost.device_type)
# --8<-- [end:preemption]
