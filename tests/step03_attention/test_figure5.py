"""Figure 5 of the docs is drawn from a real walk over a real block table (``paged.step03_attention.figure5``)."""

import pytest

from paged.step03_attention.figure5 import figure5, plot, render_text
from tests.tolerances import FLOAT64


def test_figure5_walks_the_table_in_logical_order_over_a_shuffled_pool():
    """Exact: the walk visits each logical block once, in order, at its physical block, reading #filled keys."""
    walk = figure5()
    assert [s.logical for s in walk.steps] == list(range(len(walk.table)))
    assert [s.physical for s in walk.steps] == walk.table
    assert walk.table != sorted(walk.table)  # the pool handed blocks out shuffled
    assert [len(s.positions) for s in walk.steps] == [4, 4, 2]
    assert [p for s in walk.steps for p in s.positions] == list(range(10))
    maxima = [s.running_max for s in walk.steps]
    assert maxima == sorted(maxima) and len(set(maxima)) == 3  # m rises at every block: the rescaling shows


def test_figure5_output_equals_sdpa_and_weights_sum_to_one():
    """Toleranced (``FLOAT64``'s absolute bound: float64 round-off): the online softmax reorders SDPA's sums."""
    walk = figure5()
    assert walk.max_diff < FLOAT64["atol"]
    assert sum(walk.weights) == pytest.approx(1.0, abs=FLOAT64["atol"])


def test_committed_figure5_is_what_the_walk_draws_today(tmp_path):
    """Exact: docs/figures/step03_figure5.txt is the text of a fresh walk; the picture is a PNG."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[2] / "docs" / "figures"
    walk = figure5()
    assert (root / "step03_figure5.txt").read_text() == render_text(walk)
    plot(walk, tmp_path / "f5.png")
    assert (tmp_path / "f5.png").read_bytes().startswith(b"\x89PNG")
