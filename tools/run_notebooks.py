"""Execute every notebook in a folder, in place of `jupyter nbconvert --execute`.

Used by ``make notebooks`` (part of ``make test``). Notebooks are committed
without outputs; this runs them in memory, fails on the first error, and writes
nothing back.
"""

import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient


def main(folder: str) -> int:
    paths = sorted(Path(folder).glob("*.ipynb"))
    if not paths:
        print(f"no notebooks in {folder}")
        return 1
    for path in paths:
        start = time.perf_counter()
        nb = nbformat.read(path, as_version=4)
        NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}).execute()
        print(f"ran {path} in {time.perf_counter() - start:.1f} s")
    print(f"{len(paths)} notebooks ran without error")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "docs/notebooks"))
