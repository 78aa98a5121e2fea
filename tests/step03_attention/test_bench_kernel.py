"""``python -m paged.bench kernel --json`` on a tiny grid: its JSON contract.

Times are not checked (they are noise on a tiny grid); the shape of the last
line is, and the kernel's output is checked against contiguous SDPA on every case.
"""

import json

import pytest
import torch

from paged.bench.__main__ import main


def test_bench_kernel_json_last_line(capsys, tmp_path):
    argv = ["kernel", "--batch", "2", "3", "--context", "1", "17", "--dtype", "float32", "bfloat16",
            "--block-size", "8", "--sweep-block-sizes", "4", "16", "--repeats", "1", "--warmup", "0",
            "--heads", "4", "--kv-heads", "2", "--head-dim", "64", "--plot", str(tmp_path / "k.png"), "--json"]
    assert main(argv) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    cases = result["cases"]
    assert [(c["batch"], c["context"], c["dtype"]) for c in cases] == [
        (b, c, d) for d in ("float32", "bfloat16") for b in (2, 3) for c in (1, 17)
    ]
    for c in cases:
        for key in ("contiguous_ms", "reference_ms", "cpu_kernel_ms", "blockwise_ms"):
            assert isinstance(c[key], float) and c[key] > 0, (key, c)
        # same K/V on both sides: the kernel must agree with SDPA (float32 / bfloat16 rounding)
        assert c["max_abs_diff"] <= (1e-5 if c["dtype"] == "float32" else 2**-7), c
    assert len(result["block_size_sweep"]) == 2 * 2 * 2  # dtypes x contexts x block sizes
    for key in ("geomean_cpu_kernel_over_contiguous", "geomean_reference_over_contiguous"):
        assert isinstance(result[key], float) and result[key] > 0
    assert (tmp_path / "k.png").stat().st_size > 0


def test_bench_kernel_gap_idles_before_every_timed_call(capsys, monkeypatch):
    """Exact: with ``--gap-ms 2`` every call the bench times (warm-up included) follows one 2 ms sleep,
    and the JSON says the gap; without it, no sleep."""
    from paged.bench import kernel

    slept = []
    monkeypatch.setattr(kernel.time, "sleep", slept.append)
    argv = ["kernel", "--batch", "1", "--context", "5", "--dtype", "float32", "--sweep-block-sizes",
            "--repeats", "2", "--warmup", "1", "--heads", "2", "--kv-heads", "1", "--head-dim", "16", "--json"]
    assert main(argv + ["--gap-ms", "2"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    systems = [k for k in result["cases"][0] if k.endswith("_ms") and result["cases"][0][k] is not None]
    assert result["gap_ms"] == 2.0 and slept == [0.002] * (1 + 2) * len(systems), (slept, systems)
    slept.clear()
    assert main(argv) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["gap_ms"] == 0.0 and slept == []


def test_bench_kernel_cuda_points_to_the_gpu_benchmark():
    """``kernel --device cuda`` names the GPU benchmark instead of timing anything."""
    with pytest.raises(SystemExit, match="paged.bench kernel_gpu"):
        main(["kernel", "--device", "cuda"])


def test_bench_kernel_gpu_without_gpu_says_so(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit, match="needs a CUDA GPU"):
        main(["kernel_gpu", "--device", "cuda"])
