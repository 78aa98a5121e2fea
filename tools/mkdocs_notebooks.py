"""mkdocs hook: each step notebook becomes a page of the site, with its outputs.

``make notebooks`` executes ``docs/notebooks/*.ipynb`` into ``build/notebooks/``
(``tools/run_notebooks.py``). For each one this hook adds a page
``notebooks/<name>.md``: the markdown cells as they are, each code cell as a
Python block, then its outputs (text as a text block, plots as PNG files next to
the page, HTML as it is). The committed notebook, without outputs, stays
downloadable beside it as ``notebooks/<name>.ipynb``.

The pages are ordinary pages, so their formulas go through the KaTeX hook and the
search index finds them. A notebook that was not executed, or was edited since,
fails the build with the command that fixes it.
"""

import base64
from pathlib import Path

import nbformat
from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File

EXECUTED = "build/notebooks"  # relative to mkdocs.yml's folder, the repository root
FOLDER = "notebooks"


def on_files(files, config):
    """Add one page (and its PNGs) per notebook of docs/notebooks/."""
    executed_dir = Path(config["config_file_path"]).parent / EXECUTED
    for source in sorted((Path(config["docs_dir"]) / FOLDER).glob("*.ipynb")):
        executed = executed_dir / source.name
        if not executed.exists() or executed.stat().st_mtime < source.stat().st_mtime:
            raise PluginError(f"{executed} is missing or older than {source}: run `make notebooks` "
                              "first (it executes every notebook into build/notebooks/)")
        markdown, images = to_markdown(nbformat.read(executed, as_version=4), source.stem)
        files.append(File.generated(config, f"{FOLDER}/{source.stem}.md", content=markdown))
        for name, data in images.items():
            files.append(File.generated(config, f"{FOLDER}/{name}", content=data))
    return files


def to_markdown(nb, stem: str) -> tuple[str, dict[str, bytes]]:
    """The notebook as page markdown, and its plots by file name (relative to the page)."""
    parts, images = [], {}
    for number, cell in enumerate(nb.cells):
        if cell.cell_type == "markdown":
            parts.append(cell.source)
            if number == 0:
                parts.append(_banner(stem))
        elif cell.cell_type == "code":
            parts.append(f"```python\n{cell.source}\n```")
            for k, output in enumerate(_merge_streams(cell.get("outputs", []))):
                parts.append(_output(output, f"{stem}_{number}_{k}.png", images))
    return "\n\n".join(p for p in parts if p) + "\n", images


def _merge_streams(outputs: list) -> list:
    """Consecutive prints to the same stream as one output (the kernel sends them in pieces)."""
    merged = []
    for output in outputs:
        last = merged[-1] if merged else None
        if (output.output_type == "stream" and last is not None and last.output_type == "stream"
                and last.name == output.name):
            merged[-1] = nbformat.v4.new_output("stream", name=output.name, text=last.text + output.text)
        else:
            merged.append(output)
    return merged


def _banner(stem: str) -> str:
    """Where this page comes from and how to run the notebook yourself."""
    return (f'!!! info "This page is the notebook `docs/notebooks/{stem}.ipynb`, executed"\n'
            f"    Outputs and plots come from running it with `make notebooks`. "
            f"[Download the notebook]({stem}.ipynb) (committed without outputs) or run it in a "
            f"clone: `.venv/bin/jupyter lab docs/notebooks/{stem}.ipynb`.")


def _output(output, image_name: str, images: dict[str, bytes]) -> str:
    """One output of a code cell as markdown: a plot, HTML, or text."""
    if output.output_type == "stream":
        return _text_block(output.text)
    if output.output_type == "error":  # run_notebooks stops first; kept for a notebook edited by hand
        return _text_block("\n".join(output.traceback))
    data = output.get("data", {})
    if "image/png" in data:
        images[image_name] = base64.b64decode(data["image/png"])
        return f"![output of the cell above]({image_name})"
    if "text/html" in data:
        return f'<div class="notebook-html" markdown="0">\n{data["text/html"]}\n</div>'
    if "text/plain" in data:
        return _text_block(data["text/plain"])
    return ""


def _text_block(text: str) -> str:
    """A text output, fenced so that markdown leaves it as it is."""
    fence = "````" if "```" in text else "```"
    return f'{fence}text title="output"\n{text.rstrip()}\n{fence}'
