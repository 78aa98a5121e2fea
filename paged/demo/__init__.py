"""The bundled demo model: a small code-completion LLaMA trained by `paged` itself.

These machines cannot download model weights, so `paged` trains and ships its own
model on the Python standard library's source (see ``docs/demo_model.md``):

- :mod:`paged.demo.corpus` — the stdlib files and the deterministic train / held-out split,
- :mod:`paged.demo.tokenizer` — the byte-level BPE tokenizer,
- :mod:`paged.demo.train` — ``python -m paged.demo.train``, the training run,
- :mod:`paged.demo.evaluate` — the held-out loss written into the model card.

``DEFAULT_MODEL_PATH`` is the shipped Hugging Face folder (package data): config.json,
model.safetensors, tokenizer files, README.md. ``paged.models.default`` defines it, so the
engines (which may not import this package: it sits above them) load it by default.
"""

from paged.models.default import DEFAULT_MODEL_PATH

__all__ = ["DEFAULT_MODEL_PATH"]
