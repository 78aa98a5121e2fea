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

``build_lock`` guards a build: ``cpp_extension``'s own lock is a file that names no
owner, so one left by a killed build (a newcomer's Ctrl-Z + kill, a closed
terminal, an out-of-memory kill) would make every later process wait on it
forever, including those already waiting. An ``flock`` on a file beside it is
released by the kernel when its holder dies, however it dies: a waiter wakes at
once, and the ``cpp_extension`` lock it then finds was left by a dead builder.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import torch

try:
    import fcntl
except ImportError:  # Windows: no flock; cpp_extension's lock file alone
    fcntl = None


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


@contextlib.contextmanager
def build_lock(folder: Path, library: str) -> Iterator[None]:
    """Hold ``folder``'s build lock while ``cpp_extension.load`` builds (or checks) ``library`` in it.

    Waits while a live process holds it, saying once which one; a holder that dies
    releases it. Holding it, a ``cpp_extension`` ``lock`` file in the folder was left by
    a builder that died (every builder holds this lock first) and is removed. When the
    folder has no ``library`` yet, says that a first build starts, and how to watch it.
    """
    if fcntl is None:
        yield
        return
    owner = folder / "paged.lock"  # the pid of the holder, for the waiting message
    fd = os.open(owner, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
            print(f"paged: waiting for process {holder}, which is building the C++ kernels in {folder}",
                  file=sys.stderr, flush=True)
            fcntl.flock(fd, fcntl.LOCK_EX)  # returns when the holder releases it or dies
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        (folder / "lock").unlink(missing_ok=True)  # cpp_extension's, from a builder that is gone
        if not (folder / library).exists():
            print(f"paged: compiling the C++ kernels into {folder} (once per copy of the sources and CPU: minutes on 2 cores; "
                  "python -m paged.kernels shows the progress)", file=sys.stderr, flush=True)
        yield
    finally:
        os.close(fd)  # releases the flock
