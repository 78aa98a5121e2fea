"""The optional dependencies of ``paged`` (pyproject.toml's extras), named when one is missing.

``pip install paged`` installs the core: the engines, the models, the kernels.
``python -m paged.serve`` needs the ``serve`` extra as well; without it, the
first import of the server's packages would end in a bare
``ModuleNotFoundError: No module named 'fastapi'``. ``missing_extra`` turns such
an error into one that names the extra, what of it is not installed, and the
command that installs it.
"""

from __future__ import annotations

import re
from importlib import metadata

_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")


def _normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def extra_requirements(extra: str, dist: str = "paged") -> list[str]:
    """The distribution names ``dist[extra]`` adds (as pyproject.toml lists them); [] when ``dist`` is not
    installed (run from a source tree), so nothing can be said."""
    try:
        requires = metadata.requires(dist) or []
    except metadata.PackageNotFoundError:
        return []
    marker = re.compile(rf"""extra\s*==\s*["']{re.escape(extra)}["']""")
    return [_NAME.match(r)[1] for r in requires if marker.search(r.partition(";")[2]) and _NAME.match(r)]


def _installed(name: str) -> bool:
    try:
        metadata.distribution(name)
    except metadata.PackageNotFoundError:
        return False
    return True


def missing_extra(err: ModuleNotFoundError, extra: str, command: str) -> ModuleNotFoundError | None:
    """The error to raise in place of ``err`` when it comes from ``paged[extra]`` not being installed, else None.

    ``err`` is the extra's when its module is one of the extra's packages, or when any of them is not
    installed (a package's import name may differ from its distribution's: ``swagger-ui-bundle-v2``).

    Args:
        err: the error an import of ``command``'s modules raised.
        extra: the extra ``command`` needs, e.g. ``"serve"``.
        command: what needs it, for the message, e.g. ``"python -m paged.serve"``.
    """
    wanted = extra_requirements(extra)
    absent = [name for name in wanted if not _installed(name)]
    module = (err.name or "").partition(".")[0]
    if not absent and _normalize(module) not in {_normalize(name) for name in wanted}:
        return None
    return ModuleNotFoundError(
        f"{command} needs the optional dependencies of paged[{extra}], and "
        f"{', '.join(absent) if absent else module} {'is' if len(absent) <= 1 else 'are'} not installed: "
        f"pip install 'paged[{extra}]' (in a clone: pip install -e '.[{extra}]')",
        name=err.name)
