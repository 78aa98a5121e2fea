"""Every ``python -m`` command the Makefile, README and docs give runs without runpy's RuntimeWarning.

runpy warns (``'X' found in sys.modules after import of package 'P', but prior to execution of 'X'``)
when importing ``X``'s own package already imported ``X``: the script then runs as a second copy of a
module that is loaded. The cause is in the package, so the test checks it there: importing each
package leaves its ``-m`` modules (a package's ``__main__``) unimported.
"""

import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COMMAND = re.compile(r"-m ((?:paged|tests)(?:\.\w+)*)")


def _entry_points() -> set[str]:
    texts = [ROOT / "Makefile", ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    return {m for path in texts for m in COMMAND.findall(path.read_text())}


def _run_target(module: str) -> str:
    """The module runpy executes for ``python -m module``: a package's ``__main__``, else the module."""
    spec = __import__("importlib.util").util.find_spec(module)
    return f"{module}.__main__" if spec.submodule_search_locations is not None else module


def test_the_entry_points_are_found():
    assert {"paged.serve", "paged.models.default", "paged.bench", "tests.labs"} <= _entry_points()


def test_no_package_imports_its_own_entry_point():
    by_package = defaultdict(list)
    for module in sorted(_entry_points()):
        target = _run_target(module)
        by_package[target.rpartition(".")[0]].append(target)
    found = {}
    for package, targets in by_package.items():  # one fresh process per package, as `python -m` has
        code = f"import sys, {package}; print([t for t in {targets!r} if t in sys.modules])"
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
        if done.stdout.strip() != "[]":
            found[package] = done.stdout.strip()
    assert not found, f"packages that import their own `python -m` module (runpy warns): {found}"
