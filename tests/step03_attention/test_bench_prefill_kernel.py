"""``python -m paged.bench prefill_kernel --json`` on a tiny grid: its JSON contract.

Times are not checked (they are noise on a tiny grid); the shape of the last
line is, and so is the kernel on every case: bitwise equal to per-token decode,
and close to SDPA: within ``PREFILL_BFLOAT16`` in bfloat16 (SDPA's bfloat16
kernel is the looser of the two), ``FLOAT32`` in float32, at outputs below
``MAX_OUTPUT`` (averages of rows of normal values).
"""

import json

from paged.bench.__main__ import main
from tests.tolerances import FLOAT32, PREFILL_BFLOAT16

MAX_OUTPUT = 4.0


def test_bench_prefill_kernel_json_last_line(capsys):
    argv = ["prefill_kernel", "--prompt-lens", "1", "40", "70", "--dtype", "bfloat16", "float32", "--repeats", "1",
            "--warmup", "0", "--per-token-max", "40", "--heads", "4", "--kv-heads", "2", "--json"]
    assert main(argv) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    for key in ("cpu", "cpu_family_model", "date", "threads", "load_before", "load_after"):
        assert key in result, key
    cases = result["cases"]
    assert [(c["prompt_len"], c["dtype"]) for c in cases] == [(n, d) for d in ("bfloat16", "float32") for n in (1, 40, 70)]
    for c in cases:
        for key in ("prefill_ms", "sdpa_ms", "sdpa_over_prefill", "prefill_s_all_layers", "prefill_cpu_ms",
                    "sdpa_cpu_ms", "sdpa_over_prefill_cpu"):
            assert isinstance(c[key], float) and c[key] > 0, (key, c)
        timed = c["prompt_len"] <= 40  # --per-token-max
        assert (c["per_token_ms"] is not None) == timed and (c["prefill_equals_per_token"] is True) == timed, c
        assert (c["per_token_over_prefill_cpu"] is not None) == timed, c
        tol = PREFILL_BFLOAT16 if c["dtype"] == "bfloat16" else FLOAT32
        bound = tol["atol"] + tol["rtol"] * MAX_OUTPUT
        assert c["max_abs_diff_vs_sdpa"] <= bound, c


def test_bench_prefill_kernel_runs_the_implementation_asked_for(capsys):
    """``--impl scalar``: the extension's scalar kernels (the JSON says so), still bitwise per-token; a name
    that is no implementation stops the parser."""
    argv = ["prefill_kernel", "--prompt-lens", "40", "--dtype", "bfloat16", "--repeats", "1", "--warmup", "0",
            "--heads", "4", "--kv-heads", "2", "--impl", "scalar", "--json"]
    assert main(argv) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["impl"] == "scalar" and result["cases"][0]["prefill_equals_per_token"] is True
    try:
        main(["prefill_kernel", "--impl", "sse"])
    except SystemExit as exc:
        assert exc.code == 2
    else:
        raise AssertionError("--impl sse was accepted")
