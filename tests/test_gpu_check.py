"""``tools/gpu_check.py``: the GPU run's script, checked on the CPU so that it cannot rot.

* The dry run (the device emulation, tiny shapes, the GPU machine's missing packages blocked) passes and
  leaves exactly the seven files the device tool can bring back (plain names, no subfolder).
* A part that fails or hangs is recorded (a hung one killed with its children at its limit) and the
  next part still runs; the exit status says so; a spent budget starts nothing.
* Bad arguments exit 2 with a message and create nothing.
* The parsers read real outputs: ptxas's report as nvcc 13.0 prints it for sm_90, pytest's summary
  lines, the last JSON line; the goals are judged against their thresholds.
All comparisons here are exact (parsed numbers and strings).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

import gpu_check  # noqa: E402  (tools/ is not a package)
import gpu_check_report as report  # noqa: E402

FILES = {"gpu.txt", "build.txt", "pytest.txt", "kernel.txt", "engine.txt", "summary.md", "summary.json"}

# nvcc 13.0 -gencode=arch=compute_90,code=sm_90 -Xptxas=-v, as torch's extension builder runs it (ninja -v)
BUILD_LOG = """\
[1/4] /usr/local/cuda/bin/nvcc --generate-dependencies-with-compile -I/opt/torch/include -D__CUDA_NO_HALF_OPERATORS__ \
--expt-relaxed-constexpr -gencode=arch=compute_90,code=sm_90 -gencode=arch=compute_90,code=compute_90 --compiler-options \
'-fPIC' -O3 -Xptxas=-v -DPAGED_HEADERS=0a1b2c -std=c++17 -c /repo/csrc/cuda/paged_attention_v1.cu -o paged_attention_v1.cuda.o
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function '_ZN10paged_cuda25paged_attention_v1_kernelI13__nv_bfloat16Li32ELi64EEEvPT_PKS2_S5_S5_PKiS7_iif' for 'sm_90'
ptxas info    : Function properties for _ZN10paged_cuda25paged_attention_v1_kernelI13__nv_bfloat16Li32ELi64EEEvPT_PKS2_S5_S5_PKiS7_iif
    8 bytes stack frame, 4 bytes spill stores, 4 bytes spill loads
ptxas info    : Used 56 registers, used 1 barriers, 8 bytes cumulative stack size, 1568 bytes smem
ptxas info    : Compile time = 165.148 ms
[2/4] /usr/local/cuda/bin/nvcc -gencode=arch=compute_90,code=sm_90 -Xptxas=-v -c /repo/csrc/cuda/cache_ops.cu
ptxas info    : Compiling entry function '_ZN10paged_cuda18copy_blocks_kernelIhEEvPT_PKlll' for 'sm_90'
ptxas info    : Function properties for _ZN10paged_cuda18copy_blocks_kernelIhEEvPT_PKlll
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 18 registers, used 0 barriers
paged_cuda loaded: True
"""
V1_MANGLED = "_ZN10paged_cuda25paged_attention_v1_kernelI13__nv_bfloat16Li32ELi64EEEvPT_PKS2_S5_S5_PKiS7_iif"


def _run_dry(out: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, str(ROOT / "tools" / "gpu_check.py"), "--dry-run", "--out", str(out),
                           "--budget-s", "540"], capture_output=True, text=True, env=env, timeout=580)  # fmt: skip


@pytest.mark.skipif(shutil.which(os.environ.get("CXX", "c++")) is None,
                    reason="no C++ compiler: the device emulation the dry run uses cannot be built")
def test_gpu_check_dry_run_passes_with_seven_plain_files(tmp_path):
    """Exact: exit 0, the seven files and nothing else, every part passed, and each part's figures are there."""
    done = _run_dry(tmp_path / "out")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = tmp_path / "out"
    assert {p.name for p in out.iterdir()} == FILES
    for p in out.iterdir():  # what the device tool brings back: plain names, plain files, at most 16 MiB
        assert p.is_file() and re.fullmatch(r"[A-Za-z0-9._-]+", p.name) and p.stat().st_size < 16 * 2**20
    summary = json.loads((out / "summary.json").read_text())
    assert summary["passed"] and summary["dry_run"]
    assert {n: p["status"] for n, p in summary["parts"].items()} == {n: "passed" for n in gpu_check.NAMES}
    kernel = summary["parts"]["kernel"]["figures"]
    assert len(kernel["cases"]) == 4 and all(c["errors"] == {} and c["v2_ms"] > 0 for c in kernel["cases"])
    assert [c["block_size"] for c in kernel["flex_cases"] if "flex_ms" in c] == [16, 16]
    engine = summary["parts"]["engine"]["figures"]
    assert engine["greedy"]["equal"] and engine["systems"]["paged"]["finished"] == 8
    assert summary["parts"]["pytest"]["figures"]["counts"]["passed"] >= 1
    assert "**PASSED**" in (out / "summary.md").read_text()


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads process states from /proc (Linux)")
def test_gpu_check_kills_a_hung_part_and_its_children_at_the_limit(tmp_path):
    """Exact: timed_out, the log says so, and the grandchild the part started is gone too."""
    pid_file = tmp_path / "grandchild.pid"
    script = ("import subprocess, sys, time; "
              "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)']); "
              f"open({str(pid_file)!r}, 'w').write(str(p.pid)); print('started', flush=True); time.sleep(120)")
    start = time.monotonic()
    r = gpu_check.run_part([sys.executable, "-c", script], tmp_path / "part.txt", 3.0, dict(os.environ))
    assert r["timed_out"] and time.monotonic() - start < 30
    log = (tmp_path / "part.txt").read_text()
    assert "started" in log and "killed at its limit" in log
    grandchild = int(pid_file.read_text())
    deadline = time.monotonic() + 10
    while _alive(grandchild) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(grandchild)


def _alive(pid: int) -> bool:
    """Running (not gone, not a zombie left for a parent that no longer waits)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _fake_parts(monkeypatch, scripts: dict[str, str]):
    """Each part runs the given Python one-liner instead of its real command."""
    monkeypatch.setattr(gpu_check, "command", lambda name, dry_run, limit_s, python: [python, "-c", scripts[name]])


def test_gpu_check_records_a_failed_part_and_runs_the_next(monkeypatch, tmp_path, capsys):
    """Exact: build fails (exit 3), pytest after it still runs and passes; the exit status is 1."""
    _fake_parts(monkeypatch, {
        "gpu": "print('{\"torch\": \"x\", \"cuda_available\": true}')",
        "build": "import sys; print('compiler error'); sys.exit(3)",
        "pytest": "print('=========== 32 passed in 40.01s ===========')",
    })  # fmt: skip
    rc = gpu_check.main(["--out", str(tmp_path), "--only", "gpu", "build", "pytest"])
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert rc == 1 and not summary["passed"]
    assert {n: p["status"] for n, p in summary["parts"].items()} == {"gpu": "passed", "build": "failed",
                                                                     "pytest": "passed"}
    assert summary["parts"]["build"]["problems"] == ["exit status 3", "the extension did not load"]
    assert summary["parts"]["pytest"]["figures"]["counts"] == {"passed": 32}
    assert "**FAILED**" in capsys.readouterr().out


def test_gpu_check_spent_budget_starts_no_part(monkeypatch, tmp_path):
    """Exact: with 1 s for everything no part has its minimum, none runs, all are 'not run', exit 1."""
    _fake_parts(monkeypatch, {n: "raise SystemExit('must not run')" for n in gpu_check.NAMES})
    assert gpu_check.main(["--out", str(tmp_path), "--budget-s", "1"]) == 1
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert {p["status"] for p in summary["parts"].values()} == {"not run"}
    assert {p.name for p in tmp_path.iterdir()} == {"summary.md", "summary.json"}


@pytest.mark.parametrize("argv, message", [
    ([], "--out DIR is required"),
    (["--out", "FILE"], "exists and is not a folder"),
    (["--out", "NEW", "--budget-s", "0"], "--budget-s must be > 0 seconds, got 0.0"),
    (["--out", "NEW", "--only", "gpu", "nonsense"], "invalid choice: 'nonsense'"),
])  # fmt: skip
def test_gpu_check_rejects_bad_arguments_and_creates_nothing(tmp_path, capsys, argv, message):
    """Exact: exit status 2, the message names the argument, no output folder is made."""
    (tmp_path / "FILE").write_text("x")
    argv = [str(tmp_path / a) if a in ("FILE", "NEW") else a for a in argv]
    with pytest.raises(SystemExit) as e:
        gpu_check.main(argv)
    assert e.value.code == 2 and message in capsys.readouterr().err
    assert not (tmp_path / "NEW").exists()


def test_gpu_check_gpu_commands():
    """Exact: on the GPU the pytest part selects -m cuda over every file with a cuda mark and nothing
    else; the benchmarks get their budgets from the part's limit and run at their full defaults."""
    files = gpu_check.cuda_test_files()
    assert {"tests/kernels/test_cuda_kernels.py", "tests/step05_preemption/test_transparency.py"} <= set(files)
    assert all("mark.cuda" in (ROOT / f).read_text() for f in files)
    pytest_argv = gpu_check.command("pytest", False, 150, "py")
    assert pytest_argv[:2] == ["py", "-m"] and pytest_argv[-len(files) - 2:] == ["-m", "cuda", *files]
    assert "-k" not in pytest_argv
    assert gpu_check.command("kernel", False, 130, "py") == ["py", "-m", "paged.bench", "kernel_gpu", "--json",
                                                              "--budget-s", "110"]
    assert gpu_check.command("engine", False, 300, "py")[-2:] == ["--system-timeout-s", "115"]


def test_gpu_check_site_makes_blocked_packages_absent():
    """Exact: with the dry run's sitecustomize, a blocked module fails to import and find_spec says None."""
    code = "import importlib.util, sys\ntry:\n    import csv\nexcept ModuleNotFoundError:\n    print('blocked')\n" \
           "print(importlib.util.find_spec('csv'), importlib.util.find_spec('json') is not None)"
    env = dict(os.environ, PYTHONPATH=str(gpu_check.BLOCKER), PAGED_BLOCK_IMPORTS="csv")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert done.stdout.split() == ["blocked", "None", "True"]


@pytest.mark.parametrize("cxxfilt", [True, False], ids=["demangled", "raw"])
def test_gpu_check_parses_ptxas_and_arch_flags(monkeypatch, cxxfilt):
    """Exact: each kernel's registers, shared memory, stack and spills; the distinct nvcc targets."""
    if cxxfilt and report.shutil.which("c++filt") is None:
        pytest.skip("c++filt (binutils) is not on PATH")
    if not cxxfilt:
        monkeypatch.setattr(report.shutil, "which", lambda name: None)
    kernels = report.parse_ptxas(BUILD_LOG)
    names = (["paged_attention_v1_kernel<__nv_bfloat16, 32, 64>", "copy_blocks_kernel<unsigned char>"] if cxxfilt
             else [V1_MANGLED, "_ZN10paged_cuda18copy_blocks_kernelIhEEvPT_PKlll"])
    assert kernels == [
        {"kernel": names[0], "arch": "sm_90", "registers": 56, "smem": 1568, "stack": 8, "spill_stores": 4,
         "spill_loads": 4},
        {"kernel": names[1], "arch": "sm_90", "registers": 18, "smem": 0, "stack": 0, "spill_stores": 0,
         "spill_loads": 0},
    ]
    assert report.parse_arch_flags(BUILD_LOG) == ["arch=compute_90,code=compute_90", "arch=compute_90,code=sm_90"]
    check = report.check_build(BUILD_LOG, dry_run=False)
    assert check["problems"] == [] and check["notes"] == [f"1 kernels spill registers: {names[0]}"]


@pytest.mark.parametrize("text, counts", [
    ("==== 32 passed in 40.00s (0:00:40) ====", {"passed": 32}),
    ("== 1 failed, 29 passed, 2 skipped, 3 warnings in 12.30s ==", {"failed": 1, "passed": 29, "skipped": 2,
                                                                    "warnings": 3}),
    ("===== 1 error in 0.52s =====", {"errors": 1}),
    ("=== 7 passed, 7 skipped, 95 deselected in 3.56s ===", {"passed": 7, "skipped": 7, "deselected": 95}),
    ("====== no tests ran in 0.01s ======", {}),
])  # fmt: skip
def test_gpu_check_parses_pytest_summary_lines(text, counts):
    """Exact: the counts of pytest's last summary line."""
    assert report.parse_pytest("collected 32 items\n\nsome output\n" + text + "\n")["counts"] == counts


def test_gpu_check_pytest_skips_fail_on_the_gpu_only():
    """Exact: a skip is a problem on the GPU (every CUDA test must run there), not in a dry run."""
    text = ("SKIPPED [3] tests/kernels/test_cuda_kernels.py:255: needs a CUDA GPU\n"
            "FAILED tests/kernels/test_cuda_kernels.py::test_x[cuda] - AssertionError\n"
            "==== 1 failed, 28 passed, 3 skipped in 9.10s ====\n")
    gpu = report.check_pytest(text, dry_run=False)["problems"]
    assert gpu == ["1 failed, 0 errors: tests/kernels/test_cuda_kernels.py::test_x[cuda]",
                   "3 skipped on the GPU: tests/kernels/test_cuda_kernels.py:255: needs a CUDA GPU"]
    assert report.check_pytest(text.replace("1 failed, ", ""), dry_run=True)["problems"] == []


def test_gpu_check_last_json_line():
    """Exact: the last line that is a JSON object, skipping later plain lines; None when there is none."""
    assert report.last_json('{"a": 1}\n{"a": 2}\nwrote x.png\n[1, 2]\n') == {"a": 2}
    assert report.last_json("{not json}\nno json here\n") is None


def test_gpu_check_goals_against_their_thresholds():
    """Exact: met / not met at the stated bounds (>= 70 %, <= 1.15x, >= 1), and None in a dry run."""
    parts = {"pytest": {"figures": {"counts": {"passed": 32}}},
             "kernel": {"figures": {"summary": {"v2_copy_fraction_at_longest": {"a": 0.5, "b": 0.7},
                                                "geomean_auto_over_flash": 1.16}}},
             "engine": {"figures": {"paged_over_hf": 1.0}}}
    assert [g["met"] for g in report.goals(parts, dry_run=False)] == [True, True, False, True]
    assert [g["met"] for g in report.goals(parts, dry_run=True)] == [None] * 4


@pytest.mark.parametrize("argv, message", [
    (["kernel_gpu", "--device", "cpu", "--heads", "40", "--kv-heads", "3"], "--heads (40) must be a multiple of --kv-heads (3)"),
    (["kernel_gpu", "--device", "cpu", "--batch", "8", "0"], "--batch must be >= 1, got [0]"),
    (["kernel_gpu", "--device", "cpu", "--repeats", "0"], "--repeats must be >= 1"),
    (["engine_gpu", "--device", "cpu", "--max-len", "4096"], "--max-len must be in [2, 2048] (the one-b model's context)"),
    (["engine_gpu", "--device", "cpu", "--kv-gib", "0"], "--kv-gib and --system-timeout-s must be > 0"),
    (["engine_gpu", "--device", "cpu", "--num-requests", "0"], "--num-requests must be >= 1, got 0"),
])  # fmt: skip
def test_gpu_benchmarks_reject_bad_arguments_before_any_work(argv, message):
    """Exact: the benchmarks of the GPU run name the bad argument and its bound, and build or load nothing."""
    from paged.bench.__main__ import main

    with pytest.raises(SystemExit) as e:
        main(argv)
    assert message in str(e.value.code)


def test_kernel_gpu_flex_sweep_skips_a_failing_block_size_and_stops_at_the_budget(monkeypatch):
    """Exact: after flex fails at one block size none of its other cases is tried (each would compile
    again), the others go on; past --budget-s no case starts and the note says why."""
    from argparse import Namespace

    from paged.bench import kernel_gpu

    calls = []

    def fake_case(args, kernels, gen, device, dtype, batch, context, block_size, with_flex):
        calls.append((block_size, batch))
        return {"errors": {"flex": "cannot compile"} if block_size == 8 else {}}

    monkeypatch.setattr(kernel_gpu, "time_case", fake_case)
    monkeypatch.setattr(kernel_gpu, "_print_row", lambda row, copy_gbps: None)
    args = Namespace(flex_dtypes=["bfloat16"], flex_block_sizes=[8, 16], batch=[1, 2], context=[64], budget_s=100)
    rows, note = kernel_gpu.flex_sweep(args, None, None, None, 1.0, time.perf_counter())
    assert calls == [(8, 1), (16, 1), (16, 2)] and len(rows) == 3 and note is None
    calls.clear()
    rows, note = kernel_gpu.flex_sweep(args, None, None, None, 1.0, time.perf_counter() - 101)
    assert calls == [] and rows == [] and note == "stopped at --budget-s 100 s: 0 cases timed"
