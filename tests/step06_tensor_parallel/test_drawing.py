"""The step 06 layout picture draws what it is given (``paged.step06_tensor_parallel.drawing``).

Reading the layout needs a two-process engine (about a minute here), which the
tests of ``test_engine`` already cover; these tests draw a synthetic layout.
"""

import torch

from paged.step06_tensor_parallel.drawing import Layout, draw, figure


def _layout() -> Layout:
    keys = [torch.randn(3, 4, 1, 8, generator=torch.Generator().manual_seed(r)) for r in range(2)]
    return Layout(blocks=[2, 0], filled=[4, 2], keys=keys, kv_shapes=[(1, 2, 3, 4, 1, 8)] * 2)


def test_one_heat_map_per_rank_and_block_of_that_ranks_keys():
    """Exact: 2 ranks x 2 blocks = 4 heat maps, each a copy of one rank's block; unfilled slots NaN (blank)."""
    layout = _layout()
    maps = [ax.images[0].get_array() for ax in figure(layout).axes if ax.images]
    assert len(maps) == 4
    k0, k1 = layout.keys
    torch.testing.assert_close(torch.tensor(maps[0].data), k0[2, :, 0], rtol=0, atol=0)  # rank 0, block 2
    torch.testing.assert_close(torch.tensor(maps[3].data[:2]), k1[0, :2, 0], rtol=0, atol=0)  # rank 1, block 0
    assert torch.isnan(torch.tensor(maps[3].data[2:])).all()  # block 0 has #filled 2: slots 2, 3 blank


def test_draw_writes_a_png(tmp_path):
    """Exact: the file written is a PNG."""
    draw(_layout(), tmp_path / "layout.png")
    assert (tmp_path / "layout.png").read_bytes().startswith(b"\x89PNG")
