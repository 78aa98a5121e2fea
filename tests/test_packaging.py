"""A wheel built from the repository carries the kernel sources, so an installed ``paged`` can build them.

The C++ / CUDA sources live in ``csrc/`` at the repository root; ``setup.py`` copies them into the
wheel as ``paged/csrc/``, where ``paged.kernels.cpu`` / ``cuda`` look when no repository is around.
The server's live KV page (``paged/serve/static/kv.html``) is package data and must be there too.
"""

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BUILD_INPUTS = ("pyproject.toml", "setup.py", "MANIFEST.in", "README.md", "paged", "csrc")


def test_wheel_contains_every_kernel_source_under_paged_csrc(tmp_path):
    """Every file of ``csrc/`` is in the wheel at ``paged/csrc/<same path>``, byte for byte."""
    src = tmp_path / "src"
    src.mkdir()
    for name in BUILD_INPUTS:  # a copy, so the build leaves nothing in the repository
        copy = shutil.copytree if (ROOT / name).is_dir() else shutil.copy2
        copy(ROOT / name, src / name)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--quiet",
                    "-w", str(tmp_path / "dist"), str(src)], check=True, timeout=300)
    (wheel,) = (tmp_path / "dist").glob("paged-*.whl")
    sources = [p for p in sorted((ROOT / "csrc").rglob("*")) if p.is_file()]
    assert sources, "no kernel sources in csrc/"
    with zipfile.ZipFile(wheel) as z:
        for path in sources:
            name = "paged/csrc/" + path.relative_to(ROOT / "csrc").as_posix()
            assert z.read(name) == path.read_bytes(), name
        assert any(n.startswith("paged/kernels/cpu.py") for n in z.namelist())
        assert z.read("paged/serve/static/kv.html") == (ROOT / "paged/serve/static/kv.html").read_bytes()
        metadata = z.read(next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))).decode()
    core = [line for line in metadata.splitlines() if line.startswith("Requires-Dist:") and "extra ==" not in line]
    assert not any(dep in line for line in core for dep in ("fastapi", "uvicorn", "matplotlib")), core
