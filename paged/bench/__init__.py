"""Benchmarks that reproduce the paper's figures: ``python -m paged.bench <name>``.

Each module in this package that defines ``add_arguments(parser)`` and
``run(args)`` is one experiment; its module docstring's first line is its help.
Every experiment prints a table, writes a figure with ``--plot PATH`` and, with
``--json``, prints exactly one JSON object as its last line (docs/architecture.md, conventions).
"""
