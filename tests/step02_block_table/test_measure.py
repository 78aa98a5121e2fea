"""The measurement script runs and reports one row per block size (its numbers are not asserted)."""

import torch

from paged.step02_block_table.measure import format_rows, measure


def test_measure_reports_each_block_size():
    rows = measure(num_tokens=9, block_sizes=(1, 4), num_kv_heads=1, head_dim=2, repeats=1)
    assert [(r["B"], r["blocks"]) for r in rows] == [(1, 9), (4, 3)]
    assert all(r[key] > 0 for r in rows for key in r if key.endswith("_us"))
    text = format_rows(rows, 9, torch.float32)
    assert "9 tokens" in text and len(text.splitlines()) == 3 + 1 + len(rows) + 1
