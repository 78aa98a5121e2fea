"""``LLM`` at step05: the API over the preempting engine (``preemption_mode``, ``swap_space``,
chunked prefill)."""

from paged.step04_sharing import LLM as Step04LLM
from paged.step05_preemption.engine import PreemptingEngine


class LLM(Step04LLM):
    """As ``paged.step04_sharing.LLM``; adds ``preemption_mode`` and ``swap_space``."""

    engine_class = PreemptingEngine
