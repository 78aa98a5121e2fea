"""mkdocs hook: the block-table player's recorded runs become files of the site.

``make docs`` records the runs first (``tools/record_runs.py build/player``: real engine
runs, written as ``build/player/<name>.js``). For each one this hook adds
``player/runs/<name>.js`` to the site, where a page's ``<div class="kv-player"
data-run="<name>">`` finds it (``docs/player/player.js`` draws it). A page that names a
run not recorded, or a run older than the code it records, fails the build with the
command that fixes it.
"""

import re
from pathlib import Path

from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File

RECORDED = "build/player"  # relative to mkdocs.yml's folder, the repository root
PLAYER = re.compile(r'class="kv-player" data-run="([\w-]+)"')


def on_files(files, config):
    """Add ``player/runs/<name>.js`` for every run a page of docs/ plays."""
    root = Path(config["config_file_path"]).parent
    recorded = root / RECORDED
    wanted = set()
    for file in list(files):
        if file.src_uri.endswith(".md") and file.abs_src_path:
            wanted.update(PLAYER.findall(Path(file.abs_src_path).read_text()))
    recorder = root / "tools" / "record_runs.py"
    for name in sorted(wanted):
        run = recorded / f"{name}.js"
        if not run.exists() or run.stat().st_mtime < recorder.stat().st_mtime:
            raise PluginError(f"{run} is missing or older than {recorder}: run `make docs` (it records the "
                              f"player's runs with `python tools/record_runs.py {RECORDED}`)")
        files.append(File.generated(config, f"player/runs/{name}.js", content=run.read_bytes()))
    return files
