"""The whole CUDA check on a GPU machine, in one command that ends in under 8 minutes.

    python3 tools/gpu_check.py --out DIR            # on the GPU machine (what `make gpu-check OUT=DIR` runs)
    python3 tools/gpu_check.py --out DIR --dry-run  # anywhere: the same parts on the CPU, tiny shapes

Five parts run one after the other, each in its own process group with its own
time limit (killed at it, with everything it started), each writing one file
in DIR; a part that fails or times out is recorded and the next one still runs:

==========  ============  ===================================================================
part        file          what
==========  ============  ===================================================================
gpu         gpu.txt       nvidia-smi, the GPU's properties, torch / CUDA / nvcc versions
build       build.txt     csrc/cuda built by torch's extension builder for the GPU's arch
                          (TORCH_CUDA_ARCH_LIST from nvidia-smi's compute_cap unless set),
                          its nvcc command lines and ptxas's registers / shared memory per kernel
pytest      pytest.txt    pytest -m cuda over every test file with a cuda-marked test
kernel      kernel.txt    python -m paged.bench kernel_gpu: Figure 18a, paged v1 / v2 vs
                          flash SDPA and FlexAttention, bandwidth vs the copy bandwidth
engine      engine.txt    python -m paged.bench engine_gpu: the engine vs transformers'
                          continuous batching on a 1.1 B LLaMA, and greedy equality
==========  ============  ===================================================================

then ``summary.md`` (read this first) and ``summary.json``: seven files, none in a
subfolder. A part gets ``min(its limit, what is left of --budget-s after the
minimums of the parts after it)``; one that would get less than its minimum is
not started. The exit status is 0 when every part passed (gpu_check_report says
what passing means for each), 1 otherwise, 2 for bad arguments.

Runs under the machine's own Python and torch, from a checkout (no install, no
virtual environment: the children run from the repository root with it on
``PYTHONPATH``). It needs none of the project's dependencies that the GPU
machine it was prepared for lacks (``ABSENT_ON_DEVICE``): ``--dry-run`` runs
every part with their imports failing, so a new dependency on one fails here
first. The dry run uses the device emulation (``paged.kernels.cuda_emulated``),
the wall clock and tiny shapes; ``tests/test_gpu_check.py`` runs it in ``make test``.

Run remotely (docs/kernels.md, "The GPU check"): ``PYTHONUNBUFFERED=1 python3
tools/gpu_check.py --out $OUT`` from the checkout's root, nothing to copy beside
it, 560 s allowed (the budget is 470 s, the rest is margin).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gpu_check_report as report  # noqa: E402  (tools/ is not a package)

ROOT = Path(__file__).resolve().parents[1]
BLOCKER = Path(__file__).resolve().parent / "gpu_check_site"  # sitecustomize.py: PAGED_BLOCK_IMPORTS
# The project's dependencies (core, serve and test, and the server's pydantic and starlette) that the GPU
# machine's image lacks: nothing the check runs may import them.
ABSENT_ON_DEVICE = ("gguf", "llguidance", "fastapi", "uvicorn", "pydantic", "starlette", "swagger_ui_bundle", "openai",
                    "schemathesis", "jsonschema")  # fmt: skip
DEFAULT_BUDGET_S = 470.0  # 7 min 50 s: the whole run ends inside 8 minutes
DRY_RUN_BUDGET_S = 900.0


@dataclass(frozen=True)
class Part:
    name: str
    file: str
    limit_s: float  # at most this long on the GPU machine
    min_s: float  # not started with less than this left
    dry_limit_s: float  # at most this long in a dry run (a first build of the emulation takes minutes)


PARTS = (
    Part("gpu", "gpu.txt", 60, 5, 60),
    Part("build", "build.txt", 240, 60, 420),
    Part("pytest", "pytest.txt", 150, 30, 180),
    Part("kernel", "kernel.txt", 130, 45, 120),  # about 30 s of sweep; flex gets the rest
    Part("engine", "engine.txt", 300, 150, 180),  # set-up and greedy check about a minute, then two runs
)
NAMES = [p.name for p in PARTS]

BUILD_GPU = "from paged.kernels import cuda; cuda.load(verbose=True); print('paged_cuda loaded:', cuda.available())"
BUILD_DRY = "from paged.kernels import cuda_emulated as e; e.load(verbose=True); print('emulation loaded:', e.available())"
KERNEL_DRY = ["--device", "cpu", "--batch", "2", "--context", "16", "40", "--dtype", "bfloat16", "--block-sizes",
              "8", "16", "--heads", "4", "--kv-heads", "2", "--head-dim", "32", "--repeats", "3", "--warmup", "1",
              "--copy-mib", "8", "--flex-block-sizes", "16"]  # fmt: skip
ENGINE_DRY = ["--device", "cpu", "--shape", "tiny", "--dtype", "float32", "--attention-backend", "emulated-cuda",
              "--num-requests", "8", "--max-len", "256", "--length-scale", "8", "--kv-gib", "0.01",
              "--greedy-prompts", "2", "--greedy-tokens", "8"]  # fmt: skip


def cuda_test_files(root: Path = ROOT) -> list[str]:
    """Every test file that marks a test ``cuda`` (relative paths, sorted): what ``pytest -m cuda`` must see."""
    return sorted(str(p.relative_to(root)) for p in (root / "tests").rglob("test_*.py")
                  if "mark.cuda" in p.read_text(encoding="utf-8"))


def command(name: str, dry_run: bool, limit_s: float, python: str) -> list[str]:
    """The argv of one part."""
    if name == "gpu":
        return [python, str(Path(__file__).resolve()), "--environment", *(["--dry-run"] if dry_run else [])]
    if name == "build":
        return [python, "-c", BUILD_DRY if dry_run else BUILD_GPU]
    if name == "pytest":
        select = ["-m", "cuda or emulated", "-k", "write_kv or copy_blocks"] if dry_run else ["-m", "cuda"]
        no_plugins = [x for entry in blocked_pytest_plugins() for x in ("-p", f"no:{entry}")] if dry_run else []
        return [python, "-m", "pytest", "-p", "no:cacheprovider", "-ra", *no_plugins, *select, *cuda_test_files()]
    if name == "kernel":
        budget = ["--budget-s", f"{max(10.0, limit_s - 20):.0f}"]
        return [python, "-m", "paged.bench", "kernel_gpu", "--json", *budget, *(KERNEL_DRY if dry_run else [])]
    if name == "engine":
        timeout = ["--system-timeout-s", f"{max(10.0, min(150.0, (limit_s - 70) / 2)):.0f}"]
        return [python, "-m", "paged.bench", "engine_gpu", "--json", *timeout, *(ENGINE_DRY if dry_run else [])]
    raise ValueError(f"unknown part {name!r}; the parts are {', '.join(NAMES)}")


def blocked_pytest_plugins() -> dict[str, str]:
    """Installed pytest plugins (entry point name -> top-level module) that belong to ``ABSENT_ON_DEVICE``.

    pytest scans every installed plugin's modules at start-up, before ``-p no:NAME`` applies, and
    fails on one that is blocked; so the dry run's pytest keeps them importable and disables them."""
    from importlib.metadata import entry_points

    found = {ep.name: ep.value.split(":")[0].split(".")[0] for ep in entry_points(group="pytest11")}
    return {name: module for name, module in found.items() if module in ABSENT_ON_DEVICE}


def child_env(dry_run: bool, part: str = "") -> dict:
    """The children's environment: the checkout importable, unbuffered output, Hugging Face libraries
    offline (a GPU machine may have no network: a lookup would wait for its timeout); in a dry run the
    device's missing packages blocked; on the GPU the build's architecture from nvidia-smi and the
    build in /tmp unless ``PAGED_EXTENSIONS_DIR`` says otherwise."""
    env = dict(os.environ, PYTHONUNBUFFERED="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    paths = [str(ROOT)] + ([str(BLOCKER)] if dry_run else []) + [p for p in [env.get("PYTHONPATH")] if p]
    env["PYTHONPATH"] = os.pathsep.join(paths)
    if dry_run:
        keep = set(blocked_pytest_plugins().values()) if part == "pytest" else set()
        env["PAGED_BLOCK_IMPORTS"] = ",".join(m for m in ABSENT_ON_DEVICE if m not in keep)
        return env
    env.setdefault("PAGED_EXTENSIONS_DIR", "/tmp/paged-gpu-check/torch_extensions")
    if "TORCH_CUDA_ARCH_LIST" not in env:
        cap = _query_gpu("compute_cap")
        if cap:
            env["TORCH_CUDA_ARCH_LIST"] = cap.splitlines()[0].strip()
    return env


def _query_gpu(fields: str) -> str | None:
    if shutil.which("nvidia-smi") is None:
        return None
    done = subprocess.run(["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader"], capture_output=True,
                          text=True, timeout=30)  # fmt: skip
    return done.stdout.strip() if done.returncode == 0 else None


def run_part(argv: list[str], log_path: Path, limit_s: float, env: dict) -> dict:
    """Run one part with its output in ``log_path``; kill its process group at ``limit_s``.

    Returns ``{"rc", "seconds", "timed_out"}``.
    """
    start = time.monotonic()
    with open(log_path, "w", encoding="utf-8") as log:
        log.write(f"$ {shlex.join(argv)}\n# limit {limit_s:.0f} s, started {_now()}\n")
        log.flush()
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, env=env,
                                start_new_session=True)  # fmt: skip
        timed_out = False
        try:
            proc.wait(timeout=limit_s)
        except subprocess.TimeoutExpired:
            timed_out = True
        except BaseException:  # Ctrl-C: take the part's processes down with us
            _kill(proc)
            raise
        if timed_out:
            _kill(proc)
        seconds = time.monotonic() - start
        log.write(f"\n# exit {proc.returncode} after {seconds:.1f} s" + (" (killed at its limit)" if timed_out else "")
                  + "\n")  # fmt: skip
    return {"rc": proc.returncode, "seconds": seconds, "timed_out": timed_out}


def _kill(proc: subprocess.Popen) -> None:
    """SIGTERM to the part's process group, SIGKILL 10 s later if anything is still there."""
    for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, 30)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def environment(dry_run: bool) -> int:
    """The gpu part: nvidia-smi and what the run depends on, then one JSON line."""
    info = {"date": _now(), "python": sys.version.split()[0], "dry_run": dry_run}
    smi = shutil.which("nvidia-smi")
    if smi:
        print(subprocess.run([smi], capture_output=True, text=True, timeout=30).stdout, flush=True)
        fields = "name,driver_version,compute_cap,memory.total,clocks.max.sm,clocks.max.memory"
        info["nvidia_smi"] = dict(zip(fields.split(","), (x.strip() for x in (_query_gpu(fields) or "").split(","))))
    if shutil.which("nvcc"):
        version = subprocess.run(["nvcc", "--version"], capture_output=True, text=True).stdout.splitlines()
        info["nvcc"] = next((line.strip() for line in version if "release" in line), "?")
        from paged.kernels.cuda import toolkit_home

        info["cuda_home"] = str(toolkit_home())  # the toolkit paged.kernels.cuda.load builds with
    import torch

    info.update(torch=torch.__version__, torch_cuda=torch.version.cuda, cuda_available=torch.cuda.is_available())
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        info.update(device=p.name, capability=f"{p.major}.{p.minor}", sms=p.multi_processor_count,
                    memory_gib=round(p.total_memory / 2**30, 1), l2_mib=getattr(p, "L2_cache_size", 0) / 2**20)
    for name in ("transformers", "triton"):
        try:
            info[name] = __import__(name).__version__
        except ImportError as e:
            info[name] = f"missing ({e})"
    print(json.dumps(info))
    ok = dry_run or (smi is not None and info["cuda_available"])
    return 0 if ok else 1


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="tools/gpu_check.py", description=__doc__.split("\n\n")[0],
                                epilog=__doc__.split("\n\n", 1)[1], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, help="folder for the outputs (made if missing)")
    p.add_argument("--dry-run", action="store_true", help="on the CPU: device emulation, tiny shapes")
    p.add_argument("--only", nargs="+", choices=NAMES, metavar="PART", help=f"run only these parts ({', '.join(NAMES)})")
    p.add_argument("--budget-s", type=float, help=f"seconds for all parts (default {DEFAULT_BUDGET_S:.0f}; "
                                                   f"dry run {DRY_RUN_BUDGET_S:.0f})")
    p.add_argument("--python", default=sys.executable, help="interpreter of the parts (default: this one)")
    p.add_argument("--environment", action="store_true", help=argparse.SUPPRESS)  # the gpu part itself
    args = p.parse_args(argv)
    if args.environment:
        return args
    if args.out is None:
        p.error("--out DIR is required")
    if args.out.exists() and not args.out.is_dir():
        p.error(f"--out {args.out} exists and is not a folder")
    if args.budget_s is None:
        args.budget_s = DRY_RUN_BUDGET_S if args.dry_run else DEFAULT_BUDGET_S
    if not args.budget_s > 0:
        p.error(f"--budget-s must be > 0 seconds, got {args.budget_s}")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.environment:
        return environment(args.dry_run)
    args.out.mkdir(parents=True, exist_ok=True)
    parts = [p for p in PARTS if args.only is None or p.name in args.only]
    deadline, results = time.monotonic() + args.budget_s, {}
    print(f"gpu_check{' --dry-run' if args.dry_run else ''}: {', '.join(p.name for p in parts)} -> {args.out} "
          f"(budget {args.budget_s:.0f} s, {_now()})", flush=True)
    own = {p.name: p.dry_limit_s if args.dry_run else p.limit_s for p in parts}
    floor = {p.name: min(p.min_s, own[p.name]) for p in parts}
    for i, part in enumerate(parts):
        later = sum(floor[p.name] for p in parts[i + 1:])
        limit = min(own[part.name], deadline - time.monotonic() - later)
        if limit < floor[part.name]:
            results[part.name] = {"rc": None, "seconds": 0.0, "timed_out": False, "limit_s": max(limit, 0.0),
                                  "not_run": f"{max(limit, 0):.0f} s left, under its minimum of "
                                             f"{floor[part.name]:.0f} s"}
            print(f"  {part.name:<7s} not run: {results[part.name]['not_run']}", flush=True)
            continue
        argv = command(part.name, args.dry_run, limit, args.python)
        results[part.name] = run_part(argv, args.out / part.file, limit, child_env(args.dry_run, part.name)) | {
            "limit_s": limit}
        r = results[part.name]
        print(f"  {part.name:<7s} exit {r['rc']} in {r['seconds']:.0f} s (limit {limit:.0f} s)"
              + (" TIMED OUT" if r["timed_out"] else ""), flush=True)
    summary = report.summarize(args.out, {p.name: p.file for p in parts}, results, args.dry_run)
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n", encoding="utf-8")
    (args.out / "summary.md").write_text(report.markdown(summary), encoding="utf-8")
    print(report.short(summary), flush=True)
    return 0 if summary["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
