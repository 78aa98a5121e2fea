"""A package whose names load on first use (PEP 562), so that importing one light module of it
imports none of the heavy ones.

Each step package re-exports the step below it and adds its own names (the ladder,
docs/architecture.md). Were those re-exports eager, ``import
paged.step03_attention.scheduler`` would run every ``__init__`` down the ladder and
pull in torch with the KV cache and the attention paths, though the scheduler holds
no tensor. ``lazy_package`` gives a package a module-level ``__getattr__`` that
imports a name's module only when the name is first read; ``__all__`` stays the
whole list, so ``from paged.step05_preemption import *`` and ``dir`` see every name.
"""

from __future__ import annotations

import importlib
import sys


def lazy_package(package: str, own: dict[str, str], below: str | None = None):
    """``(__all__, __getattr__, __dir__)`` for ``package``.

    Args:
        package: the package's dotted name (its ``__name__``).
        own: each name the package adds -> ``"module"`` (a submodule of ``package``
            defining that name, or a whole dotted name ``"paged.sampling.sampler"``) or
            ``"module:attribute"`` (the name is that attribute).
            A name here shadows the same name below (each step's ``LLM``).
        below: the package whose whole ``__all__`` this one re-exports, or None.
    """
    lower = importlib.import_module(below) if below else None
    inherited = [n for n in lower.__all__ if n not in own] if lower else []
    names = inherited + list(own)

    def __getattr__(name: str):
        if name in own:
            module, _, attribute = own[name].partition(":")
            target = module if module.startswith("paged.") else f"{package}.{module}"
            value = getattr(importlib.import_module(target), attribute or name)
        elif lower is not None and name in inherited:
            value = getattr(lower, name)
        else:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        setattr(sys.modules[package], name, value)  # read once, then a plain attribute
        return value

    def __dir__():
        return sorted(set(vars(sys.modules[package])) | set(names))

    return names, __getattr__, __dir__
