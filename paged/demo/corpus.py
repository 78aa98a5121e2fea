"""The demo model's corpus: the Python standard library's own source files.

Every machine with Python has them (PSF licence), so the corpus needs no download.
Which files count, and which are held out, is decided here and nowhere else:

- **Files**: every ``*.py`` under ``sysconfig.get_paths()["stdlib"]``, except the
  directories in :data:`EXCLUDED_DIRS` (test suites, installed packages, IDLE, generated
  codec tables, vendored wheels, pydoc's data dump) and files whose name starts with
  ``test_`` or ``_sysconfigdata``. Files that are not valid UTF-8 are skipped.
- **Split** (by file, never by line, so no held-out file leaks into training): a file is
  held out when the first 8 bytes of ``sha256(relative posix path)``, read as a
  big-endian integer, are ``0`` modulo :data:`HELDOUT_MODULUS` (about 1 file in 20).
  The rule depends only on the path, so it is the same on every machine; the contents
  of a path depend on the Python version (the shipped model was trained on the one its
  model card names).

A document is one file's text; :func:`documents` yields them in sorted path order.
"""

from __future__ import annotations

import hashlib
import os
import sysconfig
from pathlib import Path
from typing import Iterator, Literal

EXCLUDED_DIRS = frozenset(
    {
        "__pycache__",
        "site-packages",
        "dist-packages",
        "test",
        "tests",
        "idle_test",
        "idlelib",
        "turtledemo",
        "encodings",  # mostly generated charmap tables
        "ensurepip",  # vendored wheels
        "pydoc_data",  # one generated string dump
    }
)
"""Directory names skipped anywhere under the stdlib root."""

HELDOUT_MODULUS = 20
"""About one file in ``HELDOUT_MODULUS`` is held out."""

Split = Literal["train", "heldout"]


def stdlib_root() -> Path:
    """The directory of the running interpreter's standard library."""
    return Path(sysconfig.get_paths()["stdlib"])


def _included(rel: Path) -> bool:
    if any(part in EXCLUDED_DIRS or part.startswith("config-") for part in rel.parts[:-1]):
        return False
    name = rel.name
    return not (name.startswith("test_") or name.startswith("_sysconfigdata"))


def is_heldout(relpath: str) -> bool:
    """Whether the file at ``relpath`` (posix, relative to the stdlib root) is held out."""
    digest = hashlib.sha256(relpath.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") % HELDOUT_MODULUS == 0


def list_files(split: Split, root: Path | None = None) -> list[str]:
    """Sorted relative posix paths of the corpus files in ``split``.

    Raises:
        ValueError: ``split`` is not ``"train"`` or ``"heldout"``.
        FileNotFoundError: ``root`` is not a directory.
    """
    if split not in ("train", "heldout"):
        raise ValueError(f"split must be 'train' or 'heldout', got {split!r}")
    root = stdlib_root() if root is None else Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"standard library directory not found: {root}")
    want_heldout = split == "heldout"
    paths = []
    for dirpath, dirnames, filenames in os.walk(root):
        # prune excluded directories before descending (site-packages alone is large)
        dirnames[:] = [d for d in dirnames if d not in EXCLUDED_DIRS and not d.startswith("config-")]
        for name in filenames:
            rel = (Path(dirpath) / name).relative_to(root)
            if name.endswith(".py") and _included(rel) and is_heldout(rel.as_posix()) == want_heldout:
                paths.append(rel.as_posix())
    return sorted(paths)


def documents(split: Split, root: Path | None = None) -> Iterator[tuple[str, str]]:
    """Yield ``(relative path, text)`` for each readable file of ``split``, sorted by path."""
    root = stdlib_root() if root is None else Path(root)
    for rel in list_files(split, root):
        try:
            text = (root / rel).read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue  # a handful of files are latin-1 on purpose (codec tests)
        if text.strip():
            yield rel, text
