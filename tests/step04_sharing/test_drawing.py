"""The pictures of Figures 8-10 show what the snapshots hold (``paged.step04_sharing.drawing``)."""

import matplotlib
from matplotlib.figure import Figure
from matplotlib.text import Annotation

from paged.step04_sharing.diagram import figure8, figure10
from paged.step04_sharing.drawing import draw, draw_panel


def test_panel_has_one_arrow_per_table_entry_and_one_per_copy():
    """Exact: Figure 8 after copy-on-write has 2 tables x 2 entries = 4 arrows, plus 1 dashed copy arrow."""
    after_cow = figure8()[1]
    assert after_cow.copies == [(1, 3)]
    ax = Figure().subplots()
    draw_panel(ax, after_cow)
    arrows = [c for c in ax.get_children() if isinstance(c, Annotation)]
    assert len(arrows) == sum(len(blocks) for _, blocks, _, _ in after_cow.tables) + len(after_cow.copies) == 5
    texts = {t.get_text() for t in ax.texts}
    assert {"fathers", "mothers", "Four"} <= texts  # the tokens each physical block holds


def test_draw_writes_a_png_and_keeps_the_backend(tmp_path):
    """Exact: a PNG is written and the caller's matplotlib backend is unchanged."""
    before = matplotlib.get_backend()
    draw(figure8(), tmp_path / "f8.png")
    assert matplotlib.get_backend() == before
    assert (tmp_path / "f8.png").read_bytes().startswith(b"\x89PNG")


def test_figure10_last_panel_draws_the_cached_prefix_blocks():
    """Exact: after both requests end, the panel still draws the 4 blocks the prefix cache can find, with the
    words they hold, each with reference count 0 (it was an empty frame)."""
    done = figure10()[1]
    assert sorted(done.unmapped) == sorted(done.cached_free) == [3, 5, 8, 10]
    ax = Figure().subplots()
    draw_panel(ax, done)
    texts = [t.get_text() for t in ax.texts]
    assert {"Translate", "loutre", "otter", "love"} <= set(texts)
    assert texts.count("free, still findable in the prefix cache") == 4
