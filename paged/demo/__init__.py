"""The bundled demo model: a small code-completion LLaMA trained by `paged` itself.

These machines cannot download model weights, so `paged` trains and ships its own
model on the Python standard library's source (see ``docs/demo_model.md``):

- :mod:`paged.demo.corpus` — the stdlib files and the deterministic train / held-out split,
- :mod:`paged.demo.tokenizer` — the byte-level BPE tokenizer,
- :mod:`paged.demo.train` — ``python -m paged.demo.train``, the training run,
- :mod:`paged.demo.evaluate` — the held-out loss written into the model card.

``DEFAULT_MODEL_PATH`` is the shipped Hugging Face folder (package data).
This module imports nothing heavy, so ``paged`` can read the path cheaply.
"""

from pathlib import Path

DEFAULT_MODEL_PATH: Path = Path(__file__).resolve().parent / "model"
"""The shipped model folder: config.json, model.safetensors, tokenizer files, README.md."""

__all__ = ["DEFAULT_MODEL_PATH"]
