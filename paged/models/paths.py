"""Where ``paged`` keeps what it fetches and converts: ``$PAGED_CACHE_DIR``, default ``~/.cache/paged``.

Its own module, below both of its users: ``paged.models.default`` (the chat models it fetches) and
``paged.models.gguf_cache`` (converted GGUF weights). ``default`` is also a script (``python -m
paged.models.default``); were the package to import it through ``gguf_cache``, runpy would run a
second copy of a loaded module, and warn.
"""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """Where fetched models live: ``$PAGED_CACHE_DIR``, else ``~/.cache/paged``."""
    return Path(os.environ.get("PAGED_CACHE_DIR") or Path.home() / ".cache" / "paged")
