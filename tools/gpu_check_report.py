"""What ``tools/gpu_check.py`` makes of its parts' outputs: pass or fail, the figures, summary.md.

A part passes when its process exited 0 inside its limit and its output says so:

* gpu: a JSON line; on the GPU, nvidia-smi answered and torch sees CUDA;
* build: the extension loaded; ptxas's report is parsed (registers, shared
  memory, stack, spills per kernel) and the nvcc architecture flags are read
  off the build's command lines (both absent when the build was already cached);
* pytest: no failure or error and at least one test passed; on the GPU also no
  skip (every CUDA test must run there);
* kernel: a JSON line in which flash, v1 and v2 ran and agreed on every case
  (FlexAttention's failures are notes: it is a comparison, not our code);
* engine: a JSON line, greedy outputs equal to transformers', and the engine
  finished its workload in time (transformers' failures are notes).

The goals of the GPU run are reported beside, met or not; they do not decide the exit status.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

from gpu_check_markdown import brief, render  # tools/ is on sys.path: gpu_check.py and the tests put it there

ENTRY = re.compile(r"Compiling entry function '([^']+)' for '(\w+)'")
FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
USED = re.compile(r"Used (\d+) registers")
SMEM = re.compile(r"(\d+) bytes smem")
ARCH = re.compile(r"(?:-gencode[= ]|--generate-code[= ])(arch=[\w,=\[\]]+)")
PYTEST_END = re.compile(r"^=+ (.+?) in [\d.]+s\b.*=+$")
GOALS = {"v2_copy_fraction": 0.70, "auto_over_flash": 1.15, "paged_over_hf": 1.0}


def last_json(text: str) -> dict | None:
    """The last line of ``text`` that is a JSON object, or None."""
    for line in reversed(text.splitlines()):
        line = line.strip()
        if line.startswith("{") and line.endswith("}"):
            try:
                value = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(value, dict):
                return value
    return None


def parse_ptxas(text: str) -> list[dict]:
    """One dict per kernel ptxas compiled: ``{"kernel", "arch", "registers", "smem", "stack", "spill_stores",
    "spill_loads"}`` (``kernel`` demangled, without its argument list, when c++filt is there)."""
    kernels, current = [], None
    for line in text.splitlines():
        if m := ENTRY.search(line):
            current = {"kernel": m.group(1), "arch": m.group(2), "registers": None, "smem": 0, "stack": 0,
                       "spill_stores": 0, "spill_loads": 0}
            kernels.append(current)
        elif current is None:
            continue
        elif m := FRAME.search(line):
            current.update(stack=int(m.group(1)), spill_stores=int(m.group(2)), spill_loads=int(m.group(3)))
        elif m := USED.search(line):
            current["registers"] = int(m.group(1))
            if s := SMEM.search(line):
                current["smem"] = int(s.group(1))
    names = _demangle([k["kernel"] for k in kernels])
    for k, name in zip(kernels, names):
        k["kernel"] = name
    return kernels


def _demangle(names: list[str]) -> list[str]:
    if not names or shutil.which("c++filt") is None:
        return names
    done = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True)
    out = done.stdout.splitlines()
    if done.returncode != 0 or len(out) != len(names):
        return names
    return [re.sub(r"^void |\(.*\)$", "", n).replace("paged_cuda::", "") for n in out]


def parse_arch_flags(text: str) -> list[str]:
    """The distinct ``arch=...,code=...`` targets of the nvcc command lines in a build log."""
    return sorted(set(ARCH.findall(text)))


def parse_pytest(text: str) -> dict:
    """``{"counts": {"passed": n, ...}, "failed": [test ids], "skipped": [reasons]}`` from pytest's output."""
    counts = {}
    for line in text.splitlines():
        if m := PYTEST_END.match(line.strip()):
            counts = {}
            for part in m.group(1).split(", "):
                n, _, word = part.partition(" ")
                if n.isdigit():
                    counts[{"error": "errors", "warning": "warnings"}.get(word, word)] = int(n)
    failed = [m.group(2) for m in re.finditer(r"^(FAILED|ERROR) (\S+)", text, re.M)]
    skipped = [m.group(1) for m in re.finditer(r"^SKIPPED \[\d+\] (.+)$", text, re.M)]
    return {"counts": counts, "failed": failed, "skipped": skipped}


def _read(out_dir: Path, name: str) -> str:
    path = out_dir / name
    return path.read_text(encoding="utf-8", errors="replace") if path.is_file() else ""


def check_gpu(text: str, dry_run: bool) -> dict:
    info = last_json(text)
    if info is None:
        return {"problems": ["no JSON line"], "figures": {}}
    problems = [] if dry_run or info.get("cuda_available") else ["torch sees no CUDA GPU"]
    return {"problems": problems, "figures": info}


def check_build(text: str, dry_run: bool) -> dict:
    kernels, arch = parse_ptxas(text), parse_arch_flags(text)
    notes = [] if kernels or dry_run else ["no ptxas report: the extension was already built (cached) "
                                           "or the log lost it; delete its build folder to see it"]
    spills = [k["kernel"] for k in kernels if k["spill_stores"] or k["spill_loads"]]
    if spills:
        notes.append(f"{len(spills)} kernels spill registers: {', '.join(spills[:6])}")
    loaded = "loaded: True" in text
    return {"problems": [] if loaded else ["the extension did not load"], "notes": notes,
            "figures": {"arch_flags": arch, "kernels": kernels}}


def check_pytest(text: str, dry_run: bool) -> dict:
    result = parse_pytest(text)
    c, problems = result["counts"], []
    if c.get("failed") or c.get("errors"):
        problems.append(f"{c.get('failed', 0)} failed, {c.get('errors', 0)} errors: {', '.join(result['failed'][:8])}")
    if not c.get("passed"):
        problems.append("no test passed")
    if c.get("skipped") and not dry_run:
        problems.append(f"{c['skipped']} skipped on the GPU: {'; '.join(result['skipped'][:4])}")
    return {"problems": problems, "figures": result}


def check_kernel(text: str, dry_run: bool) -> dict:
    result = last_json(text)
    if result is None:
        return {"problems": ["no JSON line (the benchmark did not finish)"], "figures": {}}
    bad = [f"{c['dtype']} batch {c['batch']} ctx {c['context']} B={c['block_size']}: {c['errors']}"
           for c in result["cases"] if c["errors"]]
    flex_bad = [c["errors"] for c in result["flex_cases"] if c["errors"]]
    notes = [f"flex: {len(flex_bad)} of {len(result['flex_cases'])} cases failed, first: {flex_bad[0]}"] if flex_bad else []
    if result.get("flex_note"):
        notes.append(f"flex: {result['flex_note']}")
    return {"problems": [f"{len(bad)} cases with errors, first: {bad[0]}"] if bad else [], "notes": notes,
            "figures": result}


def check_engine(text: str, dry_run: bool) -> dict:
    result = last_json(text)
    if result is None:
        return {"problems": ["no JSON line (the benchmark did not finish)"], "figures": {}}
    problems, paged = [], result["systems"]["paged"]
    if not result["greedy"]["equal"]:
        problems.append(f"greedy outputs differ from transformers': {result['greedy']['first_difference']}")
    if paged["timed_out"]:
        problems.append(f"the engine timed out after {paged['seconds']:.0f} s ({paged['finished']} requests done)")
    notes = [f"{k}: {v}" for k, v in result["notes"].items()]
    hf = result["systems"].get("hf_continuous")
    if hf and hf["timed_out"]:
        notes.append(f"transformers timed out after {hf['seconds']:.0f} s ({hf['finished']} requests done)")
    return {"problems": problems, "notes": notes, "figures": result}


CHECKS = {"gpu": check_gpu, "build": check_build, "pytest": check_pytest, "kernel": check_kernel,
          "engine": check_engine}


def summarize(out_dir: Path, files: dict[str, str], results: dict[str, dict], dry_run: bool) -> dict:
    """Every part's status, problems, notes and figures, the goals, and ``passed`` (all parts passed)."""
    parts = {}
    for name, file in files.items():
        r = results[name]
        entry = {"file": file, "seconds": round(r["seconds"], 1), "limit_s": round(r["limit_s"], 1), "rc": r["rc"]}
        if r.get("not_run"):
            entry.update(status="not run", problems=[r["not_run"]], notes=[], figures={})
        else:
            check = CHECKS[name](_read(out_dir, file), dry_run)
            problems = check["problems"]
            if r["timed_out"]:
                problems = [f"killed at its limit of {r['limit_s']:.0f} s"] + problems
            elif r["rc"] != 0:
                problems = [f"exit status {r['rc']}"] + problems
            entry.update(status="passed" if not problems else "timed out" if r["timed_out"] else "failed",
                         problems=problems, notes=check.get("notes", []), figures=check["figures"])
        parts[name] = entry
    return {"dry_run": dry_run, "parts": parts, "goals": goals(parts, dry_run),
            "passed": all(p["status"] == "passed" for p in parts.values())}


def goals(parts: dict, dry_run: bool) -> list[dict]:
    """The GPU run's goals, each with the figure measured and whether it is met (None: not measured)."""
    def fig(part, *keys):
        value = parts.get(part, {}).get("figures") or {}
        for k in keys:
            value = value.get(k) if isinstance(value, dict) else None
        return value

    counts = fig("pytest", "counts") or {}
    tests_ok = None if not counts else bool(counts.get("passed")) and not (
        counts.get("failed") or counts.get("errors") or counts.get("skipped"))
    fractions = fig("kernel", "summary", "v2_copy_fraction_at_longest") or {}
    best = max(fractions.values(), default=None)
    ratio, hf = fig("kernel", "summary", "geomean_auto_over_flash"), fig("engine", "paged_over_hf")
    rows = [
        {"goal": "every CUDA test passes (none skipped)", "measured": counts or None, "met": tests_ok},
        {"goal": f"v2 at the longest context reaches >= {GOALS['v2_copy_fraction']:.0%} of the copy bandwidth",
         "measured": best, "met": None if best is None else best >= GOALS["v2_copy_fraction"]},
        {"goal": f"paged decode (auto) <= {GOALS['auto_over_flash']}x flash SDPA (geomean)", "measured": ratio,
         "met": None if ratio is None else ratio <= GOALS["auto_over_flash"]},
        {"goal": "engine output tokens/s >= transformers' continuous batching", "measured": hf,
         "met": None if hf is None else hf >= GOALS["paged_over_hf"]},
    ]
    if dry_run:  # tiny shapes on the CPU: nothing here says anything about a GPU
        for row in rows:
            row["met"] = None
    return rows


def markdown(summary: dict) -> str:
    """summary.md: the parts' table, the goals, then each part's figures (``gpu_check_markdown``)."""
    return render(summary)


def short(summary: dict) -> str:
    """The parts' table and the goals, without the long tables."""
    return brief(summary)
