"""The docs tooling: formulas rendered at build time, notebooks as pages, code that draws.

The docs build itself runs in ``make test`` after pytest (``make docs``); these
tests pin the pieces a reader depends on, each in well under a second (the
KaTeX ones start node once per call).
"""

import base64
import doctest
import importlib
import sys
from pathlib import Path
from types import SimpleNamespace

import matplotlib
import nbformat
import pytest
from mkdocs.exceptions import PluginError

TOOLS = Path(__file__).resolve().parents[1] / "tools"
sys.path.insert(0, str(TOOLS))

import mkdocs_katex  # noqa: E402  (tools/ is not a package)
import mkdocs_notebooks  # noqa: E402

PAGE = SimpleNamespace(file=SimpleNamespace(src_uri="page.md"))


def test_katex_renders_a_formula_and_restores_it_after_the_search_index():
    """Exact: the placeholder holds the formula's plain text; the written page holds KaTeX's HTML."""
    content = '<p>rescale by <span class="arithmatex">\\(e^{m - m\'}\\)</span></p>'
    indexed = mkdocs_katex.on_page_content(content, PAGE, {}, None)
    assert "arithmatex" not in indexed and "\\(" not in indexed
    assert 'class="katex-pending"' in indexed and "em−m′" in indexed
    written = mkdocs_katex.on_post_page(indexed, PAGE, {})
    assert 'class="katex"' in written and "katex-pending" not in written


def test_katex_fails_the_build_on_a_formula_it_cannot_render():
    """Exact: an undefined command raises PluginError naming the page and the formula."""
    content = '<div class="arithmatex">\\[\\notacommand{x}\\]</div>'
    with pytest.raises(PluginError, match=r"(?s)page\.md: 1 formula.*notacommand"):
        mkdocs_katex.on_page_content(content, PAGE, {}, None)


def test_notebook_page_keeps_code_text_plots_and_html_outputs():
    """Exact: each kind of output becomes its markdown form (consecutive prints as one block), PNGs byte for byte."""
    png = b"\x89PNG\r\n\x1a\nfake"
    code = nbformat.v4.new_code_cell("print(1)")
    code.outputs = [
        nbformat.v4.new_output("stream", name="stdout", text="1\n"),
        nbformat.v4.new_output("stream", name="stdout", text="2\n"),
        nbformat.v4.new_output("display_data", data={"image/png": base64.b64encode(png).decode()}),
        nbformat.v4.new_output("execute_result", data={"text/html": "<b>x</b>", "text/plain": "x"},
                               execution_count=1),
    ]
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("# Title"), code])
    markdown, images = mkdocs_notebooks.to_markdown(nb, "stepXX")
    assert markdown.startswith("# Title\n\n!!! info")
    assert "[Download the notebook](stepXX.ipynb)" in markdown
    assert '```python\nprint(1)\n```\n\n```text title="output"\n1\n2\n```' in markdown
    assert images == {"stepXX_1_1.png": png} and "![output of the cell above](stepXX_1_1.png)" in markdown
    assert '<div class="notebook-html" markdown="0">\n<b>x</b>\n</div>' in markdown


@pytest.mark.parametrize("module", ["paged.step01_allocator.allocator", "paged.step01_allocator.buddy",
                                    "paged.step02_block_table.block_table"])
def test_docstring_examples_run(module):
    """Exact: the ``Examples:`` the API reference shows as code print what they claim (doctest)."""
    result = doctest.testmod(importlib.import_module(module))
    assert result.attempted > 0 and result.failed == 0


def _plots():
    """Each plotting function of the library with small made-up data: (name, call(path))."""
    from paged.bench import preemption_plots, prefix, sharing, waste
    from paged.step02_block_table import diagram

    shares = {c: 1 / len(waste.CATEGORIES) for c in waste.CATEGORIES}
    saved = {kind: {str(w): 0.2 for w in sharing.WIDTHS} for kind in ("parallel", "beam")}
    case = {"prefix_tokens": next(iter(prefix.PAPER_SPEEDUP)), "prefill_tokens_ratio": 0.3, "speedup": 1.5,
            "on": {"blocks_mean": 2.0}, "off": {"blocks_mean": 4.0}}
    row = {"waiting": 1, "running": 2, "swapped": 0, "preemptions": {"swap": 1, "recompute": 0},
           "blocks_used": 3, "swap_blocks_used": 1, "blocks_total": 4}
    micro = {"block_size": 16, "recompute_ms": 3.0, "swap_out_ms": 1.0, "swap_in_ms": 1.0, "swap_ms": 2.0}
    e2e = {"swap": {"normalized_latency_s": 0.1, "preemptions": {"swap": 1, "recompute": 0},
                    "throughput_tok_s": 100.0}}
    return [
        ("waste.plot", lambda path: waste.plot({"paged": shares, "orca_max": shares}, "test", path)),
        ("sharing.plot", lambda path: sharing.plot(saved, next(iter(sharing.PAPER)), path)),
        ("prefix.plot", lambda path: prefix.plot([case], path)),
        ("preemption_plots.plot_timeline", lambda path: preemption_plots.plot_timeline({"swap": [row]}, path, "t")),
        ("preemption_plots.plot_figure19",
         lambda path: preemption_plots.plot_figure19({"micro": [micro], "e2e": e2e}, path, "t")),
        ("step02 diagram.plot", lambda path: diagram.plot(diagram.figure6()[1], 8, path)),
    ]


@pytest.mark.parametrize("index", range(6))
def test_plots_leave_the_matplotlib_backend_alone(tmp_path, index):
    """Exact: each library plot writes a PNG and does not switch the user's backend (a notebook's
    later plots would come out empty)."""
    name, call = _plots()[index]
    before = matplotlib.get_backend()
    matplotlib.use("svg")
    try:
        call(str(tmp_path / "plot.png"))
        assert matplotlib.get_backend() == "svg", name
        assert (tmp_path / "plot.png").read_bytes().startswith(b"\x89PNG"), name
    finally:
        matplotlib.use(before)


NOTEBOOKS = sorted((Path(__file__).resolve().parents[1] / "docs" / "notebooks").glob("*.ipynb"))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_has_parameters_and_two_predictions_an_assert_checks(path):
    """Each notebook: a Parameters cell near the top; at least two Predict cells (``name = ...``), each
    followed by a cell that checks it with ``check(name, ...)``; ``check`` raises AssertionError on a wrong
    prediction, accepts a right one, and with no prediction (``...``) prints the answer."""
    nb = nbformat.read(path, as_version=4)
    code = [c.source for c in nb.cells if c.cell_type == "code"]
    params = next((i for i, s in enumerate(code) if "def check(" in s), None)
    assert params is not None and params <= 1, f"{path.name}: no Parameters cell among the first two code cells"
    names = [line.split("=")[0].strip() for s in code for line in s.splitlines()
             if line.rstrip().split("#")[0].strip().endswith("= ...")]
    assert len(names) >= 2, f"{path.name}: {len(names)} Predict cells, at least 2 wanted"
    for name in names:
        where = next(i for i, s in enumerate(code) if f"{name} = ..." in s)
        assert any(f"check({name}," in s for s in code[where + 1:]), f"{path.name}: nothing checks {name}"
    space = {}
    exec(code[params], space)  # the Parameters cell: constants and ``check``, nothing else
    with pytest.raises(AssertionError, match="you predicted 3, the run says 4: why"):
        space["check"](3, 4, "why")
    space["check"](4, 4, "why")
    space["check"](..., 4, "why")


def test_iteration_figure_text_is_what_a_run_draws_today():
    """docs/figures/step03_iterations.txt equals, exactly, the text ``tools/iteration_figure.py`` draws from a
    new run of the step 03 engine (greedy, float32, the reference path: the same tokens every run)."""
    import iteration_figure
    import record_runs

    committed = (TOOLS.parent / "docs" / "figures" / "step03_iterations.txt").read_text()
    assert committed == iteration_figure.render_text(record_runs.run_step03(record_runs.demo_model())), (
        "regenerate with: make iteration-figure")


def test_docs_check_pictures_a_long_page_in_tiles_to_its_end(tmp_path):
    """Exact: a page up to the limit is one image; a taller one is cut into images of at most the limit, one
    below the other, the last ending at the page's end (nothing below 16 000 px is left unseen)."""
    import docs_check  # noqa: E402  (tools/ is on the path above)
    limit, shot = docs_check.MAX_SCREENSHOT_HEIGHT, tmp_path / "benchmarks.png"
    assert docs_check.screenshot_tiles(shot, 8000) == [(shot, 0, 8000)]
    assert docs_check.screenshot_tiles(shot, limit) == [(shot, 0, limit)]
    tiles = docs_check.screenshot_tiles(shot, 2 * limit + 500)
    assert [(p.name, top, h) for p, top, h in tiles] == [
        ("benchmarks.png", 0, limit), ("benchmarks.2.png", limit, limit), ("benchmarks.3.png", 2 * limit, 500)]
