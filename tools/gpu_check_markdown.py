"""summary.md of ``tools/gpu_check.py``: the parts, the goals, then each part's figures, as Markdown tables."""

from __future__ import annotations


def _fmt(x, digits: int = 3) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:.{digits}g}"
    return str(x)


def _header(summary: dict) -> list[str]:
    gpu = summary["parts"].get("gpu", {}).get("figures") or {}
    smi = gpu.get("nvidia_smi") or {}
    what = ", ".join(f"{k} {v}" for k, v in (("driver", smi.get("driver_version")), ("torch", gpu.get("torch")),
                                             ("CUDA", gpu.get("torch_cuda")), ("nvcc", gpu.get("nvcc")),
                                             ("transformers", gpu.get("transformers"))) if v)
    title = "dry run on the CPU (device emulation, tiny shapes)" if summary["dry_run"] else gpu.get("device", "GPU ?")
    lines = [f"# GPU check: {title}", "", f"{gpu.get('date', '')}; {what}", "",
             f"**{'PASSED' if summary['passed'] else 'FAILED'}**", "",
             "| part | status | seconds | limit s | file | problems | notes |", "|---|---|---|---|---|---|---|"]
    for name, p in summary["parts"].items():
        lines.append(f"| {name} | {p['status']} | {p['seconds']:.0f} | {p['limit_s']:.0f} | {p['file']} | "
                     f"{'; '.join(p['problems']) or '-'} | {'; '.join(p['notes']) or '-'} |")
    lines += ["", "## Goals", "", "| goal | measured | met |", "|---|---|---|"]
    for g in summary["goals"]:
        met = {True: "yes", False: "**no**", None: "-"}[g["met"]]
        lines.append(f"| {g['goal']} | {_fmt(g['measured'])} | {met} |")
    return lines


def _build(fig: dict) -> list[str]:
    lines = ["", "## build", "", f"nvcc targets: {', '.join(fig.get('arch_flags') or []) or '-'}"]
    kernels = fig.get("kernels") or []
    if kernels:
        lines += ["", "| kernel | arch | registers | smem bytes | stack bytes | spill stores / loads |",
                  "|---|---|---|---|---|---|"]
        lines += [f"| `{k['kernel']}` | {k['arch']} | {k['registers']} | {k['smem']} | {k['stack']} | "
                  f"{k['spill_stores']} / {k['spill_loads']} |" for k in kernels]
    return lines


def _pytest(fig: dict) -> list[str]:
    counts = ", ".join(f"{n} {w}" for w, n in (fig.get("counts") or {}).items()) or "no summary line"
    lines = ["", "## pytest", "", counts]
    lines += [f"- FAILED {t}" for t in fig.get("failed", [])] + [f"- SKIPPED {r}" for r in fig.get("skipped", [])[:10]]
    return lines


def _kernel(fig: dict) -> list[str]:
    if not fig:
        return ["", "## kernel", "", "no results"]
    s, copy = fig["summary"], fig["copy"]
    lines = ["", "## kernel", "",
             f"{fig['device']}; H={fig['heads']}, H_kv={fig['kv_heads']}, D={fig['head_dim']}; median of "
             f"{fig['repeats']} after {fig['warmup']} warm-up runs; copy bandwidth {copy['gbps']:.0f} GB/s "
             f"(read + write, {copy['mib']} MiB)", "",
             f"paged (auto) / flash: geomean {_fmt(s['geomean_auto_over_flash'])}, worst "
             f"{_fmt(s['max_auto_over_flash'])}; cases with errors: {s['cases_with_errors']}", "",
             "| dtype | batch | context | B | flash ms | v1 ms | v2 ms | auto | auto / flash | v1 / copy | v2 / copy |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for c in fig["cases"]:
        def frac(name):
            return _fmt(c[f"{name}_gbps"] / copy["gbps"], 2) if f"{name}_gbps" in c else "-"
        lines.append(f"| {c['dtype']} | {c['batch']} | {c['context']} | {c['block_size']} | {_fmt(c.get('flash_ms'))} "
                     f"| {_fmt(c.get('v1_ms'))} | {_fmt(c.get('v2_ms'))} | {c.get('auto', '-')} | "
                     f"{_fmt(c.get('auto_over_flash'))} | {frac('v1')} | {frac('v2')} |")
    flex = [c for c in fig["flex_cases"] if "flex_ms" in c]
    lines += ["", f"FlexAttention: {len(flex)} of {len(fig['flex_cases'])} cases timed"
              + (f" ({fig['flex_note']})" if fig.get("flex_note") else "")]
    if flex:
        lines += ["", "| dtype | batch | context | B | flash ms | flex ms | flex / flash | first call s |",
                  "|---|---|---|---|---|---|---|---|"]
        lines += [f"| {c['dtype']} | {c['batch']} | {c['context']} | {c['block_size']} | {_fmt(c['flash_ms'])} | "
                  f"{_fmt(c['flex_ms'])} | {_fmt(c['flex_over_flash'])} | {_fmt(c.get('flex_first_call_s'))} |"
                  for c in flex]
    return lines


def _engine(fig: dict) -> list[str]:
    if not fig:
        return ["", "## engine", "", "no results"]
    g, gib = fig["greedy"], 2**30
    lines = ["", "## engine", "",
             f"greedy (demo model, float32): {g['prompts']} prompts, {g['tokens']} tokens, equal to transformers "
             f"{g['transformers']}: {g['equal']}", "",
             f"model: {fig['model']}", "", f"workload: {fig['workload']}", "",
             "| system | seconds | output tokens | tokens/s | KV pool GiB | KV peak used GiB | CUDA peak GiB | "
             "finished | timed out |", "|---|---|---|---|---|---|---|---|---|"]
    for name, r in fig["systems"].items():
        used = r.get("kv_peak_used_bytes")
        peak = r.get("cuda_peak_allocated_bytes")
        lines.append(f"| {name} | {r['seconds']:.1f} | {r['output_tokens']} | {r['tokens_per_s']:.0f} | "
                     f"{r['kv_pool_bytes'] / gib:.3g} | {_fmt(used and used / gib)} | {_fmt(peak and peak / gib)} | "
                     f"{r['finished']} | {r['timed_out']} |")
    if "paged_over_hf" in fig:
        lines += ["", f"paged / transformers: {fig['paged_over_hf']:.2f}"]
    paged = fig["systems"]["paged"]
    lines += ["", f"engine: {paged.get('iterations')} iterations, preemptions {paged.get('preemptions')}, "
                  f"prefix-cache hit rate {_fmt(paged.get('prefix_cache_hit_rate'))}"]
    lines += [f"- {k}: {v}" for k, v in fig["notes"].items()]
    return lines


def brief(summary: dict) -> str:
    """The parts' table and the goals only: what the run prints last, so that the end of its output says it."""
    return "\n".join(_header(summary)) + "\n\n(every figure: summary.md)\n"


def render(summary: dict) -> str:
    parts = summary["parts"]
    lines = _header(summary)
    if "build" in parts:
        lines += _build(parts["build"]["figures"])
    if "pytest" in parts:
        lines += _pytest(parts["pytest"]["figures"])
    if "kernel" in parts:
        lines += _kernel(parts["kernel"]["figures"])
    if "engine" in parts:
        lines += _engine(parts["engine"]["figures"])
    return "\n".join(lines) + "\n"
