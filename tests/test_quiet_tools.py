"""The docs tools say nothing a reader did not cause: no page reported missing from the nav on purpose,
no kernel warning about a TCP transport (tools/mkdocs_sources.py, tools/run_notebooks.py)."""

import subprocess
import sys
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[1]


def test_the_generated_source_pages_are_built_and_out_of_the_nav_on_purpose(tmp_path):
    """A site whose one page names a file: its source page is built, and mkdocs does not list it as a page
    missing from the nav (it listed ~130 such pages per build of the docs before)."""
    (tmp_path / "paged").mkdir()
    (tmp_path / "paged" / "errors.py").write_text("x = 1\n")
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "page.md").write_text("The errors are in `paged/errors.py`.\n")
    (tmp_path / "mkdocs.yml").write_text(f"site_name: t\nnav: [page.md]\nhooks: [{ROOT / 'tools' / 'mkdocs_sources.py'}]\n")
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "site" / "source" / "paged" / "errors.py" / "index.html").is_file()
    assert "not included in the \"nav\"" not in done.stderr, done.stderr


def test_notebooks_run_over_unix_sockets_and_the_kernel_warns_of_nothing(tmp_path):
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("print(6 * 7)")])
    nbformat.write(nb, tmp_path / "one.ipynb")
    done = subprocess.run([sys.executable, str(ROOT / "tools" / "run_notebooks.py"), str(tmp_path), str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=300, check=True)
    assert "WARNING" not in done.stderr, done.stderr  # was: "Kernel is running over TCP without encryption"
    ran = nbformat.read(tmp_path / "out" / "one.ipynb", as_version=4)
    assert ran.cells[0].outputs[0]["text"] == "42\n"
