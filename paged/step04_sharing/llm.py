"""``LLM`` at step04: the step03 API over the sharing engine (``n``, ``best_of``, beam search,
prefix caching)."""

from paged.step03_attention import LLM as Step03LLM
from paged.step04_sharing.engine import SharingEngine


class LLM(Step03LLM):
    """As ``paged.step03_attention.LLM``; adds ``enable_prefix_caching`` (default True)."""

    engine_class = SharingEngine
