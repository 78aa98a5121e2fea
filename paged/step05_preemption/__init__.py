"""Step 05 — scheduling under memory pressure: gang preemption, swap and recompute (paper §4.5).

Adds: ``SwapSpace`` (the host block pool and the block moves), the swap-or-
recompute ``policy``, ``PreemptingModelRunner`` (swaps before copies before the
forward pass) ``ChunkedPrefillScheduler`` (a long prompt over several iterations),
``PreemptingScheduler`` and ``PreemptingEngine`` (FCFS over waiting / running / swapped,
all-or-nothing preemption of the newest group, chunked prefill), with the
step's ``LLM``. (The paper's Orca baselines run in this same engine, with an
admission rule of their own: ``paged.bench.reservation``.)
"""

from paged.step04_sharing import *  # noqa: F401,F403  (the ladder: re-export step04)
from paged.step04_sharing import __all__ as _step04_all
from paged.step05_preemption.chunked import ChunkedPrefillScheduler
from paged.step05_preemption.engine import PreemptingEngine
from paged.step05_preemption.llm import LLM
from paged.step05_preemption.policy import MODES as PREEMPTION_MODES
from paged.step05_preemption.runner import PreemptingModelRunner
from paged.step05_preemption.scheduler import PreemptingScheduler
from paged.step05_preemption.swap import SwapSpace, copy_between

__all__ = [n for n in _step04_all if n != "LLM"] + [
    "ChunkedPrefillScheduler",
    "LLM",
    "PREEMPTION_MODES",
    "PreemptingEngine",
    "PreemptingModelRunner",
    "PreemptingScheduler",
    "SwapSpace",
    "copy_between",
]
