"""``torch_threads(n)``: run a benchmark with ``n`` intra-op threads, then restore the setting."""

from contextlib import contextmanager

import torch


@contextmanager
def torch_threads(n: int):
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)
