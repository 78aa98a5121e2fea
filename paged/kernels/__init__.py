"""Native kernels, built on first use (docs/architecture.md, attention paths): ``cpu`` (C++ / OpenMP, ``csrc/cpu``).

Each backend module offers ``available()`` and the attention entry points with
the cache layout of docs/architecture.md; importing this package builds nothing.
"""
