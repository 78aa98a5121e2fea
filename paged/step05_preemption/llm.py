"""``LLM`` at step05: the API over the preempting engine (``preemption_mode``, ``swap_space``,
chunked prefill, and ``memory=`` for the Orca reservation baselines)."""

from paged.step04_sharing import LLM as Step04LLM
from paged.step05_preemption.engine import PreemptingEngine
from paged.step05_preemption.reservation import with_reservation


class LLM(Step04LLM):
    """As ``paged.step04_sharing.LLM``; adds ``preemption_mode`` and ``swap_space``, and
    ``memory`` (``"paged"`` or an Orca reservation mode, see ``reservation.py``)."""

    engine_class = PreemptingEngine

    def __init__(self, model=None, dtype="auto", device="cpu", *, memory: str = "paged", **engine_args) -> None:
        if memory != "paged":
            self.engine_class = with_reservation(self.engine_class)
            engine_args["memory"] = memory
        super().__init__(model, dtype, device, **engine_args)
