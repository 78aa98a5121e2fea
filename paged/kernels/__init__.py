"""Native kernels, built on first use (DESIGN §4): ``cpu`` (C++ / OpenMP, ``csrc/cpu``).

Each backend module offers ``available()`` and the attention entry points with
the shapes of DESIGN §3; importing this package builds nothing.
"""
