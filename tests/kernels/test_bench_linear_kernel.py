"""``python -m paged.bench linear_kernel --json`` on tiny shapes: its JSON contract.

Times are not checked (noise at these sizes); the shape of the last line is, the
model rows are the sums of their layers, and each fixed-order kernel (and the pair order, where
its AVX512_BF16 loop is built) gives every row checked the bits it gives that row alone
(bitwise, as batch-invariant mode needs).
"""

import json

import pytest

from paged.bench.__main__ import main


def test_bench_linear_kernel_json_last_line(capsys):
    argv = ["linear_kernel", "--rows", "1", "5", "--dtype", "bfloat16", "float32", "--scale", "16", "--layers", "2",
            "--repeats", "1", "--warmup", "0", "--json"]
    assert main(argv) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    for key in ("cpu", "cpu_family_model", "date", "threads", "load_before", "load_after", "avx2_compiled",
                "pairs_compiled"):
        assert key in result, key
    cases = result["cases"]
    assert [(c["dtype"], c["rows"]) for c in cases[::5]] == [("bfloat16", 1), ("bfloat16", 5), ("float32", 1),
                                                             ("float32", 5)]
    assert [c["layer"] for c in cases[:5]] == ["qkv", "o", "gate_up", "down", "lm_head"]
    assert (cases[0]["k"], cases[0]["n"]) == (36, 60)  # 576 / 16, 960 / 16
    for c in cases:
        assert c["rows_alone_bitwise"] is True, c
        for key in ("stock_ms", "fixed_ms", "stock_gflops", "fixed_gflops", "stock_over_fixed"):
            assert isinstance(c[key], float) and c[key] > 0, (key, c)
        # the pair order: bfloat16 only, where its AVX512_BF16 loop is built
        pairs = c["dtype"] == "bfloat16" and result["pairs_compiled"]
        assert ("pairs_ms" in c) == pairs and c.get("pairs_rows_alone_bitwise", True) is True, c
        for key in ("pairs_ms", "pairs_gflops", "stock_over_pairs") if pairs else ():
            assert isinstance(c[key], float) and c[key] > 0, (key, c)
    for i, model in enumerate(result["model"]):
        layers = cases[5 * i: 5 * i + 5]
        assert model["fixed_ms"] == pytest.approx(2 * sum(c["fixed_ms"] for c in layers[:4]) + layers[4]["fixed_ms"])
        assert model["stock_ms"] == pytest.approx(2 * sum(c["stock_ms"] for c in layers[:4]) + layers[4]["stock_ms"])
        if "pairs_ms" in layers[0]:
            assert model["pairs_ms"] == pytest.approx(2 * sum(c["pairs_ms"] for c in layers[:4]) + layers[4]["pairs_ms"])
            assert model["stock_over_pairs"] == pytest.approx(model["stock_ms"] / model["pairs_ms"])
