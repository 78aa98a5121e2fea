"""Lab 02 with one mistake: ``slot`` adds the offset to the block id instead of to ``block * B``."""

from paged.step02_block_table.block_table import BlockTable

append = BlockTable.append


def slot(self, position: int) -> int:
    if isinstance(position, bool) or not isinstance(position, int):
        raise TypeError(f"position must be an int, got {position!r}")
    if not 0 <= position < self.num_tokens:
        raise IndexError(f"position {position} is outside 0..{self.num_tokens - 1}")
    b = self.block_size
    return self.blocks[position // b] + position % b  # the mistake: blocks[p // B] * B + p % B
