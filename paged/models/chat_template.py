"""Where a checkpoint keeps its chat template, read the way transformers reads it.

A Hugging Face folder may keep its Jinja chat template in four places;
transformers (``PreTrainedTokenizerBase.from_pretrained``) looks at all of
them, and so does ``read_chat_template``:

1. ``chat_template.jinja``: the template as a plain file (what current
   transformers writes when it saves a tokenizer);
2. ``additional_chat_templates/<name>.jinja``: further named templates;
3. ``tokenizer_config.json``'s ``chat_template``: a string, or a list of
   ``{"name", "template"}`` (the older way, still the most common);
4. ``chat_template.json``'s ``chat_template`` (a processor's file).

Template files take priority over ``tokenizer_config.json``, as in
transformers. Of several named templates the one named ``default`` is used.
The special-token strings a template may print (``bos_token``,
``eos_token``) come from ``tokenizer_config.json``.
A GGUF file keeps its template in its metadata instead (``gguf_loader``).
"""

from __future__ import annotations

import json
from pathlib import Path

from paged.models.config import ModelLoadError

TEMPLATE_FILE = "chat_template.jinja"
TEMPLATE_DIR = "additional_chat_templates"
TOKENIZER_CONFIG = "tokenizer_config.json"
PROCESSOR_TEMPLATE_FILE = "chat_template.json"


def _json(path: Path) -> dict:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as err:
        raise ModelLoadError(f"{path}: cannot read JSON ({err})") from None


def _named(value, source: Path) -> dict[str, str]:
    """A ``chat_template`` entry (a string or a list of named templates) as ``{name: template}``."""
    if value is None:
        return {}
    if isinstance(value, str):
        return {"default": value}
    if isinstance(value, list) and all(isinstance(t, dict) for t in value):
        return {t.get("name"): t.get("template") for t in value if isinstance(t.get("template"), str)}
    raise ModelLoadError(f"{source}: 'chat_template' must be a string or a list of {{name, template}} objects")


def read_chat_template(folder: str | Path) -> tuple[str | None, dict[str, str]]:
    """The folder's chat template (None when it has none) and the special-token strings it may print.

    Raises:
        ModelLoadError: several named templates and none called ``default``, or an unreadable file.
    """
    folder = Path(folder)
    config_file = folder / TOKENIZER_CONFIG
    config = _json(config_file) if config_file.is_file() else {}
    templates: dict[str, str] = {}
    processor_file = folder / PROCESSOR_TEMPLATE_FILE
    if processor_file.is_file():
        templates.update(_named(_json(processor_file).get("chat_template"), processor_file))
    templates.update(_named(config.get("chat_template"), config_file))
    files = {}
    if (folder / TEMPLATE_FILE).is_file():
        files["default"] = (folder / TEMPLATE_FILE).read_text(encoding="utf-8")
    if (folder / TEMPLATE_DIR).is_dir():
        files.update({f.stem: f.read_text(encoding="utf-8") for f in sorted((folder / TEMPLATE_DIR).glob("*.jinja"))})
    if files:  # template files replace tokenizer_config.json's entry, as transformers does
        templates = files
    specials = {}
    for key in ("bos_token", "eos_token"):
        token = config.get(key)
        specials[key] = token.get("content", "") if isinstance(token, dict) else (token or "")
    if not templates:
        return None, specials
    if len(templates) > 1 and "default" not in templates:
        raise ModelLoadError(f"{folder}: chat templates {sorted(templates)} but none named 'default'")
    return templates.get("default", next(iter(templates.values()))), specials
