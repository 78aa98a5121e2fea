"""mkdocs hook: render every formula to HTML at build time with KaTeX.

``pymdownx.arithmatex`` (generic mode) leaves each formula as TeX inside
``<span class="arithmatex">\\( … \\)</span>`` or ``<div class="arithmatex">\\[ … \\]</div>``.
This hook sends all formulas of a page to KaTeX (``tools/katex/render.js``, run by
node) and puts the resulting HTML in their place, so a reader's browser runs no
script to see them and cannot fail to. A formula KaTeX cannot render fails the
build, naming the page and the formula.

The search index is built from ``page.content`` before the page is written, so the
formulas stay as their plain text (what MathML reads) until ``on_post_page``: search
snippets show ``m′=max(m,max sj)``, not TeX or KaTeX's markup. KaTeX's stylesheet and
fonts are copied into the site under ``katex/``; nothing comes from a CDN.
"""

import html
import json
import re
import subprocess
from pathlib import Path

from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File

KATEX_DIR = Path(__file__).parent / "katex"
DIST = KATEX_DIR / "node_modules" / "katex" / "dist"
FORMULA = re.compile(
    r'<(?P<tag>span|div) class="arithmatex">'
    r"(?:\\\((?P<inline>.*?)\\\)|\\\[(?P<display>.*?)\\\])</(?P=tag)>",
    re.DOTALL,
)
PLACEHOLDER = re.compile(r'<span class="katex-pending" data-formula="(\d+)">.*?</span>', re.DOTALL)
MATHML_TEXT = re.compile(r'<math[^>]*>(.*?)</math>', re.DOTALL)
ANNOTATION = re.compile(r"<annotation[^>]*>.*?</annotation>", re.DOTALL)
TAG = re.compile(r"<[^>]+>")

# page source path -> rendered formulas, filled by on_page_content, used by on_post_page
_rendered: dict[str, list[str]] = {}


def render(formulas: list[tuple[str, bool]]) -> list[dict]:
    """KaTeX's HTML (or its error message) for each (TeX, display?) pair, in order."""
    request = json.dumps([{"tex": tex, "display": display} for tex, display in formulas])
    done = subprocess.run(["node", str(KATEX_DIR / "render.js")], input=request,
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise PluginError(f"KaTeX renderer failed: {done.stderr.strip()}")
    return json.loads(done.stdout)


def plain_text(katex_html: str) -> str:
    """What a formula reads as in plain text: the text of its MathML, without the TeX."""
    mathml = MATHML_TEXT.search(katex_html)
    return html.escape(TAG.sub("", ANNOTATION.sub("", mathml.group(1))))


def on_page_content(content, page, config, files):
    """Render the page's formulas; leave plain-text placeholders for the search index."""
    matches = list(FORMULA.finditer(content))
    if not matches:
        return content
    formulas = [(html.unescape(m["inline"] if m["inline"] is not None else m["display"]),
                 m["display"] is not None) for m in matches]
    results = render(formulas)
    errors = [f"  {tex}: {r['error']}" for (tex, _), r in zip(formulas, results) if "error" in r]
    if errors:
        raise PluginError(f"{page.file.src_uri}: {len(errors)} formula(s) do not render:\n"
                          + "\n".join(errors))
    _rendered[page.file.src_uri] = [r["html"] for r in results]
    numbers = iter(range(len(results)))

    def placeholder(_match):
        n = next(numbers)
        return (f'<span class="katex-pending" data-formula="{n}">'
                f"{plain_text(results[n]['html'])}</span>")

    return FORMULA.sub(placeholder, content)


def on_post_page(output, page, config):
    """Put each formula's KaTeX HTML in place of its placeholder."""
    rendered = _rendered.pop(page.file.src_uri, None)
    if rendered is None:
        return output
    return PLACEHOLDER.sub(lambda m: rendered[int(m[1])], output)


def on_files(files, config):
    """Add KaTeX's stylesheet and fonts to the site, under katex/."""
    if not DIST.is_dir():
        raise PluginError(f"KaTeX is not installed in {KATEX_DIR}: run `make install` "
                          "(it runs `npm ci --prefix tools/katex`; needs node and npm)")
    for path in [DIST / "katex.min.css", *sorted((DIST / "fonts").iterdir())]:
        files.append(File.generated(config, f"katex/{path.relative_to(DIST).as_posix()}",
                                    abs_src_path=str(path)))
    return files
