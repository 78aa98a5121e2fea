"""Make the packages named in ``PAGED_BLOCK_IMPORTS`` (comma-separated top-level names) look absent.

``tools/gpu_check.py --dry-run`` puts this folder first on ``PYTHONPATH``, so
every part of the dry run runs as it would on a machine without them. Python
imports ``sitecustomize`` at start-up by itself. A ``None`` in ``sys.modules``
is Python's own mark of a module that cannot be imported: ``import`` raises
``ModuleNotFoundError`` and ``importlib.util.find_spec`` answers None, as for
a package that is not installed (libraries that probe for optional packages
then take their fallbacks).
"""

import os
import sys

for _name in filter(None, os.environ.get("PAGED_BLOCK_IMPORTS", "").split(",")):
    sys.modules[_name] = None
