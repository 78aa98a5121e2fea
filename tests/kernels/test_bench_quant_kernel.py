"""``python -m paged.bench quant_kernel --json`` on tiny shapes: its JSON contract.

Times are not checked (noise at these sizes); the shape of the last line is: one case per
layer the block type applies to (the K-quants only where K is a multiple of 256), a time for
every implementation compiled in (``lanes`` among them, where the VNNI loops are) and for the
dense GEMM, and model rows that are the sums of their layers (exact up to float addition:
``pytest.approx``). ``--cold``'s copies: exact.
"""

import json
import types

import pytest
import torch

from paged.bench.__main__ import main
from paged.bench.quant_kernel import COLD_BYTES, cycling
from paged.kernels import cpu


def test_bench_quant_kernel_json_last_line(capsys):
    argv = ["quant_kernel", "--type", "Q4_1", "Q6_K", "--rows", "1", "3", "--dtype", "bfloat16", "--scale", "16",
            "--layers", "2", "--repeats", "1", "--warmup", "0", "--json"]
    assert main(argv) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    for key in ("cpu", "cpu_family_model", "date", "threads", "load_before", "load_after", "compiled"):
        assert key in result, key
    ext = cpu.load(strict=True)
    avx2, vnni = ext.quant_avx2_compiled(), ext.quant_vnni_compiled()
    impls = ["scalar"] + ["avx2"] * avx2 + ["avx512"] * vnni + ["lanes"] * avx2 + ["lanes-avx2"] * vnni
    assert result["compiled"] == impls
    cases = result["cases"]
    assert [(c["type"], c["layer"], c["rows"]) for c in cases] == (
        [("Q4_1", layer, m) for m in (1, 3) for layer in ("qkv", "o", "gate_up", "down", "lm_head")]
        + [("Q6_K", "down", m) for m in (1, 3)])  # K 576 is not super-blocks: only down (1 536) takes Q6_K
    assert (cases[0]["k"], cases[0]["n"]) == (32, 60)  # 576 / 16 down to blocks of 32, 960 / 16
    for c in cases:
        for key in [f"{impl}_ms" for impl in impls] + ["dense_ms", "dense_over_fastest"]:
            assert isinstance(c[key], float) and c[key] > 0, (key, c)
        assert [k for k in c if k.endswith("_ms")] == [f"{impl}_ms" for impl in impls] + ["dense_ms"]
    q4 = [m for m in result["model"] if m["type"] == "Q4_1"]
    for i, model in enumerate(q4):
        layers = cases[5 * i: 5 * i + 5]
        for key in [f"{impl}_ms" for impl in impls] + ["dense_ms"]:
            assert model[key] == pytest.approx(2 * sum(c[key] for c in layers[:4]) + layers[4][key])
    assert [m["layers_included"] for m in result["model"]] == [["qkv", "o", "gate_up", "down", "lm_head"]] * 2 + [
        ["down"]] * 2


def test_bench_quant_kernel_refuses_an_implementation_not_compiled_in(monkeypatch):
    """A specific error before anything is timed: which implementation is missing, and those compiled in
    (a build without the VNNI loops, as on an AVX2-only CPU, stood in for on any CPU)."""
    ext = cpu.load(strict=True)
    without_vnni = types.SimpleNamespace(quant_avx2_compiled=ext.quant_avx2_compiled, quant_vnni_compiled=lambda: False)
    monkeypatch.setattr(cpu, "load", lambda strict=False: without_vnni)
    with pytest.raises(SystemExit, match="--impls avx512: not compiled in here"):
        main(["quant_kernel", "--impls", "avx512", "--scale", "16", "--rows", "1"])


def test_cold_calls_read_the_next_copy_each_time():
    """Exact: without ``--cold`` every call gets the one weight made; with it, calls go round copies of at
    least ``COLD_BYTES`` in all, each a new tensor, in turn."""
    made = []

    def make():
        made.append(torch.zeros(1 << 20, dtype=torch.uint8))
        return made[-1]

    seen = []
    call = cycling(seen.append, make, 1 << 20, cold=False)
    call(), call()
    assert len(made) == 1 and seen[0] is seen[1] is made[0]
    made.clear(), seen.clear()
    call = cycling(seen.append, make, 1 << 20, cold=True)
    copies = COLD_BYTES >> 20
    for _ in range(2 * copies):
        call()
    assert len(made) == copies == len({id(t) for t in seen}) and seen[copies:] == seen[:copies]
    assert all(a is not b for a, b in zip(seen, seen[1:]))

