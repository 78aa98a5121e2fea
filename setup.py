"""Build hook: ship the kernel sources of ``csrc/`` inside the package, as ``paged/csrc``.

The C++ and CUDA sources live at the repository root (``csrc/cpu``,
``csrc/cuda``), beside ``paged/``, not in it, so package data cannot name
them. A built wheel (``pip install .``, ``pip wheel .``) gets a copy under
``paged/csrc/``, where ``paged.kernels.cpu`` and ``paged.kernels.cuda`` look
when there is no repository around them; they compile it on first use. An
editable install needs no copy: the kernels find ``csrc/`` in the repository.
Everything else about the package is in ``pyproject.toml``.
"""

from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

KERNEL_SOURCES = Path(__file__).resolve().parent / "csrc"


class BuildPyWithKernelSources(build_py):
    """``build_py`` that also copies every file under ``csrc/`` to ``<build>/paged/csrc/``."""

    def run(self) -> None:
        super().run()
        if self.editable_mode:
            return
        for source in sorted(KERNEL_SOURCES.rglob("*")):
            if source.is_file():
                target = Path(self.build_lib) / "paged" / "csrc" / source.relative_to(KERNEL_SOURCES)
                self.mkpath(str(target.parent))
                self.copy_file(str(source), str(target))


setup(cmdclass={"build_py": BuildPyWithKernelSources})
