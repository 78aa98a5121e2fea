"""The Figure 6 / 7 diagrams come from real block tables, and the docs show what they draw."""

from pathlib import Path

from paged.step02_block_table.diagram import FIG6_STAGES, figure6, figure7, main, render_text

FIGURES = Path(__file__).resolve().parents[2] / "docs" / "figures"


def test_diagram_figure6_matches_the_paper():
    """Request A: logical 0, 1, 2 -> physical 7, 1, 3 with #filled 4, 4, 1 (B = 4)."""
    allocator, [(_, table, words)] = figure6()
    assert table.blocks == [7, 1, 3]
    assert [table.filled(i) for i in range(3)] == [4, 4, 1]
    assert words == "Four score and seven years ago our fathers brought".split()
    assert allocator.num_used == 3


def test_diagram_figure7_matches_the_paper():
    """Request B ("It was the best of times") lands in physical blocks 5 and 2 beside A."""
    allocator, [(_, a, _), (_, b, words_b)] = figure7()
    assert a.blocks == [7, 1, 3] and b.blocks == [5, 2]
    assert [b.filled(i) for i in range(2)] == [4, 2]
    assert words_b == "It was the best of times".split()
    assert sorted(allocator.free_blocks()) == [0, 4, 6]


def test_diagram_figure6_stages_are_the_papers_three():
    """After the prompt: blocks 7, 1 with #filled 4, 3; after "fathers": 4, 4; after "brought": 7, 1, 3
    with #filled 4, 4, 1 (exact)."""
    tables = [figure6(stage)[1][0][1] for stage in (1, 2, 3)]
    assert [t.blocks for t in tables] == [[7, 1], [7, 1], [7, 1, 3]]
    assert [[t.filled(i) for i in range(t.num_blocks)] for t in tables] == [[4, 3], [4, 4], [4, 4, 1]]


def test_diagram_committed_text_figures_are_current():
    """docs/figures/step02_figure{6,7}.txt equal what the code draws today (Figure 6: its three stages)."""
    stages = [(caption, figure6(k + 1)) for k, caption in enumerate(FIG6_STAGES)]
    want = {"figure6": "\n".join(f"{caption}\n{render_text(requests, allocator.num_blocks)}"
                                 for caption, (allocator, requests) in stages),
            "figure7": render_text(figure7()[1], 8)}
    for name, text in want.items():
        assert (FIGURES / f"step02_{name}.txt").read_text() == text, (
            "regenerate with: python -m paged.step02_block_table.diagram docs/figures")


def test_diagram_render_text_shows_every_block_once():
    allocator, requests = figure7()
    text = render_text(requests, allocator.num_blocks)
    pool = text.split("physical KV blocks\n")[1].splitlines()
    assert len(pool) == 8
    assert [line.split("│")[0].split()[-1] for line in pool] == [str(b) for b in range(8)]
    assert sum("free" in line for line in pool) == allocator.num_free


def test_diagram_main_writes_text_and_png(tmp_path):
    assert main(str(tmp_path)) == 0
    for name in ("figure6", "figure7"):
        assert (tmp_path / f"step02_{name}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert (tmp_path / f"step02_{name}.txt").read_text() == (FIGURES / f"step02_{name}.txt").read_text()
