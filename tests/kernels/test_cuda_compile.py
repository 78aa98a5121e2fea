"""The CUDA kernels compile cleanly here, without a GPU (docs/architecture.md, kernel versions).

Every ``csrc/cuda/*.cu`` is compiled with ``nvcc`` for ``sm_80`` (A100) and
``sm_90`` (H100/H200) with ``-Werror all-warnings`` plus the host compiler's
``-Wall -Wextra -Werror``: any warning or error fails, and the message carries
nvcc's output. ``binding.cpp`` (the torch side) is compiled by the host compiler
against torch's headers, our code with ``-Wall -Wextra -Werror`` (torch and CUDA
headers are system headers, so their own warnings do not count), and every
launcher it calls must be defined by the kernel objects (checked with ``nm``).

The compiles run in parallel, one per core, started once for the module; the
tests read their results. The compile tests are skipped, with the reason, where
``nvcc`` is absent; the last two tests need neither nvcc nor a GPU.
The numerical behaviour is tested on a GPU by
``tests/kernels/test_cuda_kernels.py`` (marked ``cuda``).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sysconfig
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
from torch.utils.cpp_extension import COMMON_NVCC_FLAGS, include_paths

from paged.kernels.cuda import point_builder_at_toolkit, toolkit_home

ROOT = Path(__file__).resolve().parents[2]
CSRC = ROOT / "csrc" / "cuda"
NVCC = shutil.which("nvcc")
KERNELS = sorted(CSRC.glob("*.cu"))
ARCHS = ["sm_80", "sm_90"]
TIMEOUT_S = 300

needs_nvcc = pytest.mark.skipif(NVCC is None, reason="nvcc is not on PATH: the CUDA kernels cannot be compiled here")

# The kernels are plain C++17. torch's extension builder also passes its
# COMMON_NVCC_FLAGS (no implicit half / bfloat16 conversions or operators): the
# compiles here add them, so code that builds here builds there.
NVCC_FLAGS = ["-c", "-O3", "-std=c++17", "-Werror", "all-warnings", "-Xcompiler", "-Wall,-Wextra,-Werror"]


def _cuda_include() -> Path:
    return toolkit_home() / "include"


def _nvcc_command(source: Path, arch: str, out_dir: Path) -> list[str]:
    code = arch.replace("sm_", "")
    obj = out_dir / f"{source.stem}.{arch}.o"
    return [NVCC, *NVCC_FLAGS, *COMMON_NVCC_FLAGS, f"-gencode=arch=compute_{code},code={arch}", "-o", str(obj), str(source)]


def _binding_command(out_dir: Path) -> list[str]:
    cxx = os.environ.get("CXX", "g++")
    system = [*include_paths(), sysconfig.get_paths()["include"], str(_cuda_include())]
    return [
        cxx, "-c", "-O0", "-fPIC", "-o", str(out_dir / "binding.o"),
        "-std=c++20", "-Wall", "-Wextra", "-Werror",  # c++20: as torch builds it
        *[f"-isystem{p}" for p in system],
        # A CPU build of torch ships c10/cuda headers without their generated
        # cuda_cmake_macros.h (it only sets an export macro); skip it here.
        "-DC10_CUDA_NO_CMAKE_CONFIGURE_FILE",
        "-DTORCH_EXTENSION_NAME=paged_cuda",
        str(CSRC / "binding.cpp"),
    ]  # fmt: skip


def _run(cmd: list[str]) -> tuple[int, str]:
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return -1, f"timed out after {TIMEOUT_S} s"
    return done.returncode, done.stdout + done.stderr


@pytest.fixture(scope="module")
def compiled(tmp_path_factory) -> dict:
    """Every compile of this module, run once, in parallel: id -> (command, rc, output),
    and "out_dir" -> the folder holding the objects."""
    out_dir = tmp_path_factory.mktemp("cuda_objects")
    jobs = {f"{src.name}-{arch}": _nvcc_command(src, arch, out_dir) for src in KERNELS for arch in ARCHS}
    jobs["binding.cpp"] = _binding_command(out_dir)
    # Longest first (the binding parses all of torch), one process per core.
    order = ["binding.cpp", *sorted((k for k in jobs if k != "binding.cpp"), key=lambda k: "cache" in k)]
    with ThreadPoolExecutor(max_workers=max(1, os.cpu_count() or 1)) as pool:
        results = dict(zip(order, pool.map(lambda k: _run(jobs[k]), order)))
    return {k: (jobs[k], *results[k]) for k in jobs} | {"out_dir": out_dir}


@needs_nvcc
def test_cuda_compile_sources_exist():
    """The kernels the CUDA path needs are the ones compiled below."""
    names = {p.name for p in KERNELS}
    assert {"paged_attention_v1.cu", "paged_attention_v2.cu", "cache_ops.cu"} <= names, names


@needs_nvcc
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("source", [p.name for p in KERNELS])
def test_cuda_compile_kernel_without_warnings(compiled, source, arch):
    """nvcc -Werror all-warnings: no error and no warning for this architecture."""
    cmd, rc, output = compiled[f"{source}-{arch}"]
    assert rc == 0 and not output.strip(), f"{' '.join(cmd)}\nexit {rc}\n{output}"


@needs_nvcc
def test_cuda_compile_binding_against_torch_headers(compiled):
    """binding.cpp compiles against torch's headers with -Wall -Wextra -Werror."""
    cmd, rc, output = compiled["binding.cpp"]
    assert rc == 0 and not output.strip(), f"{' '.join(cmd)}\nexit {rc}\n{output}"


def _symbols(obj: Path, flag: str) -> set[str]:
    """Demangled paged_cuda:: symbols of an object file (nm --defined-only / --undefined-only)."""
    out = subprocess.run(["nm", "-C", flag, str(obj)], capture_output=True, text=True, check=True).stdout
    found = (re.match(r"^\s*(?:[0-9a-fA-F]+\s+)?[A-Za-z]\s+(.*)$", line) for line in out.splitlines())
    return {m.group(1).strip() for m in found if m and "paged_cuda::" in m.group(1)}


@needs_nvcc
@pytest.mark.skipif(shutil.which("nm") is None, reason="nm (binutils) is not on PATH")
@pytest.mark.parametrize("arch", ARCHS)
def test_cuda_compile_binding_symbols_are_defined_by_kernels(compiled, arch):
    """Every launcher binding.cpp calls (ops.h) is defined, with the same signature,
    by the kernel objects: a declaration and a definition that drifted apart would
    otherwise compile and only fail when the extension is loaded on a GPU."""
    out_dir = compiled["out_dir"]
    assert compiled["binding.cpp"][1] == 0, "binding.cpp did not compile (see the test above)"
    needed = _symbols(out_dir / "binding.o", "--undefined-only")
    defined = set().union(*(_symbols(out_dir / f"{p.stem}.{arch}.o", "--defined-only") for p in KERNELS))
    assert needed, "binding.o calls no paged_cuda launcher"
    assert needed <= defined, f"undefined: {sorted(needed - defined)}"


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the behaviour without a GPU")
def test_cuda_load_without_gpu_raises_runtime_error():
    """Without a GPU, load() says so instead of attempting a build."""
    from paged.kernels import cuda

    with pytest.raises(RuntimeError, match="needs a CUDA GPU"):
        cuda.load()
    assert cuda.available() is False


def test_cuda_entry_points_reject_cpu_tensors():
    """The Python side refuses CPU tensors with a ValueError naming the argument."""
    from paged.kernels import cuda

    cache = torch.zeros(4, 8, 1, 64)
    with pytest.raises(ValueError, match="query must be a CUDA tensor"):
        cuda.paged_attention_v1(torch.zeros(1, 1, 64), cache, cache, torch.zeros(1, 1, dtype=torch.int32), torch.ones(1, dtype=torch.int32), 0.125)
    with pytest.raises(ValueError, match="kv must be a CUDA tensor"):
        cuda.copy_blocks(torch.zeros(1, 2, 4, 8, 1, 64), torch.tensor([[0, 1]]))


def test_the_builder_gets_the_toolkit_a_wrapper_nvcc_runs(tmp_path, monkeypatch):
    """Exact: ``nvcc`` on PATH a wrapper script (as ``/usr/local/bin/nvcc`` may be), the toolkit elsewhere:
    ``toolkit_home`` finds the toolkit from nvcc's own report, and torch's builder, whose guess (the wrapper's
    parent) has no ``cuda_runtime.h``, is given it; a guess that has one, and a ``CUDA_HOME`` the user set,
    are kept."""
    from types import SimpleNamespace

    toolkit = tmp_path / "cuda-13.0"
    (toolkit / "include").mkdir(parents=True)
    (toolkit / "include" / "cuda_runtime.h").write_text("")
    wrapper = tmp_path / "wrappers" / "nvcc"
    wrapper.parent.mkdir()
    wrapper.write_text(f"#!/bin/sh\necho '#$ _NVVM_BRANCH_=nvvm' >&2\necho '#$ TOP={toolkit}/bin/..' >&2\n")
    wrapper.chmod(0o755)
    monkeypatch.setenv("PATH", f"{wrapper.parent}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.delenv("CUDA_PATH", raising=False)
    assert toolkit_home() == toolkit
    builder = SimpleNamespace(CUDA_HOME=str(tmp_path))  # torch's guess: the wrapper's parent's parent
    point_builder_at_toolkit(builder)
    assert builder.CUDA_HOME == str(toolkit)
    point_builder_at_toolkit(builder)  # a guess with the header stays
    assert builder.CUDA_HOME == str(toolkit)
    monkeypatch.setenv("CUDA_HOME", "/opt/mine")
    assert toolkit_home() == Path("/opt/mine")
