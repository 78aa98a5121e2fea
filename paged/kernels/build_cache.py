"""Where the native kernels build: one folder per extension, torch version and source tree.

``$PAGED_EXTENSIONS_DIR`` (default ``~/.cache/paged/torch_extensions``) holds a
folder per build, named by what decides the binary: changed sources (another
checkout, a later commit) build into a folder of their own, so a stale library
is never loaded in their place.

The folder is also named by *where* the build's inputs are (``place_key``): the
source folder and the torch installation. ``cpp_extension`` writes both paths
into the folder's ``build.ninja``, and ninja rebuilds every object when a command
line changes, so two checkouts or virtual environments with the same sources
sharing one folder would each rebuild the library (a minute on two cores) every
time the other had loaded it last.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import torch


def source_key(src: Path) -> str:
    """A hash of every file under ``src`` (its relative path and its bytes)."""
    digest = hashlib.sha1()
    for path in sorted(p for p in src.rglob("*") if p.is_file()):
        digest.update(path.relative_to(src).as_posix().encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:8]


def place_key(src: Path) -> str:
    """A hash of the source folder's absolute path and of torch's installation folder."""
    where = f"{Path(src).resolve()}|{Path(torch.__file__).resolve().parent}"
    return hashlib.sha1(where.encode()).hexdigest()[:8]


def build_dir(extension: str, *keys: str) -> Path:
    """``<base>/<extension>-torch<version>-<key>-…``, made if missing."""
    base = os.environ.get("PAGED_EXTENSIONS_DIR") or Path.home() / ".cache" / "paged" / "torch_extensions"
    version = torch.__version__.replace("+", "_")
    path = Path(base) / "-".join([extension, f"torch{version}", *keys])
    path.mkdir(parents=True, exist_ok=True)
    return path
