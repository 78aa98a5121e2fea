"""mkdocs hook: serve MathJax from the site itself, so the docs render math offline.

MathJax 2 arrives with the ``jupyter-server-mathjax`` package (a docs
dependency). After each build we copy what a page needs (the loader, one
combined configuration, the CommonHTML output and its fonts) into
``site/mathjax``; nothing is fetched from a CDN and nothing is committed.
"""

import shutil
from pathlib import Path

PARTS = ["MathJax.js", "config", "extensions", "jax", "fonts", "localization", "LICENSE"]


def on_post_build(config, **kwargs):
    import jupyter_server_mathjax

    src = Path(jupyter_server_mathjax.__file__).parent / "static"
    dst = Path(config["site_dir"]) / "mathjax"
    dst.mkdir(parents=True, exist_ok=True)
    for part in PARTS:
        s, d = src / part, dst / part
        if s.is_dir():
            shutil.copytree(s, d, dirs_exist_ok=True)
        else:
            shutil.copy2(s, d)
