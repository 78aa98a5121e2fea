"""``python -m paged.kernels`` (``make install``): the kernels' build with its progress, or its failure whole."""

import os
import subprocess
import sys

from paged.kernels import __main__ as build
from paged.kernels import cpu

COMPILE = ("[2/6] c++ -MMD -MF fused_ops.o.d -DTORCH_EXTENSION_NAME=paged_cpu -isystem /x/torch/include -fPIC "
           "-std=c++20 -O3 -march=native -c /repo/csrc/cpu/fused_ops.cpp -o fused_ops.o")
LINK = "[6/6] c++ bindings.o fused_ops.o -shared -fopenmp -L/x/torch/lib -lc10 -o paged_cpu.so"


def test_a_ninja_line_is_shortened_to_the_file_it_compiled_or_linked():
    assert build.describe(build.STEP.match(COMPILE)[3]) == "compiled fused_ops.cpp"
    assert build.describe(build.STEP.match(LINK)[3]) == "linked paged_cpu.so"


def _run(**env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "paged.kernels"], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "OMP_NUM_THREADS": "1", **env})


def test_a_built_library_is_said_to_be_built_with_its_path():
    library = cpu.load(strict=True).__file__
    done = _run()
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.splitlines()[-1].startswith("C++ CPU kernels: already built (")
    assert done.stdout.rstrip().endswith(library)


FAILING_CXX = """#!/bin/sh
# c++ for torch's version checks; a compile error for every compile command
case " $* " in *" -c "*) echo "csrc/cpu/x.cpp:1:1: error: no compiler here" >&2; exit 1;; esac
exec c++ "$@"
"""


def test_a_failed_build_prints_the_compilers_output_and_fails(tmp_path):
    """A compiler that fails every compile, in an empty build folder: exit status 1, the output whole."""
    cxx = tmp_path / "failing-c++"
    cxx.write_text(FAILING_CXX)
    cxx.chmod(0o755)
    done = _run(PAGED_EXTENSIONS_DIR=str(tmp_path / "ext"), CXX=str(cxx))
    assert done.returncode == 1
    assert "error: no compiler here" in done.stdout  # the compiler's own words, in the output printed whole
    assert "python -m paged.kernels: the build failed" in done.stderr
