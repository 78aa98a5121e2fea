"""mkdocs hook: every repository file a page names is one click away, and every image enlarges.

The pages name files as code, `` `paged/step02_block_table/block_table.py` `` or
`` `tests/step01_allocator/` ``. For each file of the repository that a page of
``docs/`` (a step page, a notebook) names this way, ``on_files`` adds a page
``source/<path>/`` holding the file, highlighted; ``on_page_content`` turns each such
name (outside code blocks and existing links) into a link to that page. A folder
links to a page listing its files. Nothing leaves the site: a reader offline reads the
source where the page names it.

``on_page_content`` also wraps each image that is not already a link in a link to
itself, so a click opens the picture at full size.
"""

from __future__ import annotations

import html
import posixpath
import re
from pathlib import Path

from mkdocs.structure.files import File, InclusionLevel

ROOTS = ("paged", "tests", "labs", "tools", "csrc")
SOURCE_DIR = "source"
# a repository path in inline code, optionally followed by a snippet section (":name") or a line range
NAMED = re.compile(r"`((?:%s)/[A-Za-z0-9_./-]*)(?::[\w:-]+)?`" % "|".join(ROOTS))
CODE = re.compile(r'<code>((?:%s)/[A-Za-z0-9_./-]*)((?::[\w:-]+)?)</code>' % "|".join(ROOTS))
IMAGE = re.compile(r"<img\b[^>]*>")
LANG = {".py": "python", ".cpp": "cpp", ".h": "cpp", ".cu": "cuda", ".cuh": "cuda", ".js": "js",
        ".html": "html", ".css": "css", ".toml": "toml", ".txt": "text", ".md": "text", ".json": "json"}

_pages: dict[str, str] = {}  # repository path -> site path of its source page


def _page_markdown(root: Path, path: str) -> str:
    target = root / path
    if target.is_dir():
        files = sorted(p for p in target.rglob("*") if p.is_file() and "__pycache__" not in p.parts)
        names = [p.relative_to(root).as_posix() for p in files]
        items = "\n".join(f"- [`{n}`]({_link(path, n)})" for n in names if n in _pages)
        return f"# `{path}`\n\n{items or 'No file of this folder is named in the docs.'}\n"
    text = target.read_text(errors="replace")
    fence = "`" * max(3, 1 + max((len(m) for m in re.findall(r"`+", text)), default=0))
    # a snippet line in the file must stay text: the snippets extension reads the page as markdown
    text = re.sub(r"^(\s*)(-+8<-+)", r"\1;\2", text, flags=re.M)
    return (f"# `{path}`\n\n{fence}{LANG.get(target.suffix, 'text')} linenums=\"1\"\n"
            f"{text}{'' if text.endswith(chr(10)) else chr(10)}{fence}\n")


def _link(folder: str, path: str) -> str:
    """The markdown link from a folder's source page to a file's."""
    return posixpath.relpath(f"{SOURCE_DIR}/{path}.md", posixpath.dirname(f"{SOURCE_DIR}/{folder}.md"))


def on_files(files, config):
    """One page per repository file or folder a page of docs/ names in inline code."""
    root = Path(config["config_file_path"]).parent
    named: set[str] = set()
    for file in list(files):
        if file.src_uri.endswith((".md", ".ipynb")) and file.abs_src_path:
            named.update(m.group(1).rstrip("/.") for m in NAMED.finditer(Path(file.abs_src_path).read_text()))
    named = {p for p in named if (root / p).exists()}
    _pages.clear()
    _pages.update({p: f"{SOURCE_DIR}/{p}.md" for p in sorted(named)})
    for path, uri in _pages.items():
        # reached from the pages that name them, not from the nav: said so, so mkdocs lists none as missing from it
        files.append(File.generated(config, uri, content=_page_markdown(root, path),
                                    inclusion=InclusionLevel.NOT_IN_NAV))
    return files


def _relative(page_url: str, path: str) -> str:
    here = posixpath.dirname("/" + page_url.rstrip("/") + "/index.html")
    return posixpath.relpath(f"/{SOURCE_DIR}/{path}/", here) + "/"


def on_page_content(html_text, page, config, files):
    """Link each named file to its source page; let each image open at full size."""
    def link(match):
        path = match.group(1).rstrip("/.")
        if path not in _pages or page.file.src_uri == _pages[path]:
            return match.group(0)
        return f'<a class="source-link" href="{_relative(page.url, path)}">{match.group(0)}</a>'

    out, pos = [], 0
    for block in re.finditer(r"<pre\b.*?</pre>|<a\b.*?</a>", html_text, flags=re.S):  # leave code blocks, links
        out.append(CODE.sub(link, html_text[pos:block.start()]))
        out.append(block.group(0))
        pos = block.end()
    out.append(CODE.sub(link, html_text[pos:]))
    html_text = "".join(out)

    def enlarge(match):
        src = re.search(r'src="([^"]+)"', match.group(0))
        if not src or src.group(1).startswith("data:"):
            return match.group(0)
        return (f'<a class="enlarge" href="{html.escape(src.group(1))}" title="open at full size">'
                f"{match.group(0)}</a>")

    out, pos = [], 0
    for block in re.finditer(r"<a\b.*?</a>", html_text, flags=re.S):
        out.append(IMAGE.sub(enlarge, html_text[pos:block.start()]))
        out.append(block.group(0))
        pos = block.end()
    out.append(IMAGE.sub(enlarge, html_text[pos:]))
    return "".join(out)
