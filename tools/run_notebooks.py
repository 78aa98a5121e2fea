"""Execute every step notebook and keep the executed copies for the docs site.

Used by ``make notebooks`` and ``make docs`` (part of ``make test``). The notebooks are committed
without outputs; this runs each one once, fails on the first error, and writes
the executed copy (outputs and plots included) to ``build/notebooks/``, where the
docs build (``tools/mkdocs_notebooks.py``) renders it as a page. The committed
notebooks are never written.

The kernel talks to this process over Unix sockets in a private temporary folder (jupyter's
``ipc`` transport) rather than over loopback TCP, which anyone on the machine could connect
to and which the kernel warns about at every start.
"""

import sys
import tempfile
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient
from traitlets.config import Config


def main(folder: str = "docs/notebooks", out: str = "build/notebooks") -> int:
    paths = sorted(Path(folder).glob("*.ipynb"))
    if not paths:
        print(f"no notebooks in {folder}")
        return 1
    Path(out).mkdir(parents=True, exist_ok=True)
    for path in paths:
        start = time.perf_counter()
        nb = nbformat.read(path, as_version=4)
        with tempfile.TemporaryDirectory(prefix="paged-kernel-") as sockets:
            ipc = Config({"KernelManager": {"transport": "ipc", "ip": str(Path(sockets) / "kernel")}})
            NotebookClient(nb, timeout=600, kernel_name="python3", config=ipc,
                           resources={"metadata": {"path": str(path.parent)}}).execute()
        nbformat.write(nb, Path(out) / path.name)
        print(f"ran {path} in {time.perf_counter() - start:.1f} s -> {Path(out) / path.name}")
    print(f"{len(paths)} notebooks ran without error")
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
