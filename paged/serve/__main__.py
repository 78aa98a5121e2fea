"""``python -m paged.serve [options]``: see ``paged.serve.cli`` and docs/serving.md."""

from paged.serve.cli import main

main()
