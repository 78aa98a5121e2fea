"""Which recovery a preempted group gets: swap or recompute (paper §4.5, §7.3).

``preemption_mode``:

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
"""

from __future__ import annotations

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
