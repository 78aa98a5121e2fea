"""Lab 05 with one mistake: ``_move`` gives every table entry its own block, so a block two
sequences share is copied twice and shared no more."""

from paged.step05_preemption.policy import Preemption

choose = Preemption.choose


def _move(self, seqs, src, dst):
    copies = []
    for seq in seqs:
        table = seq.block_table
        for i, block in enumerate(table.blocks):
            new = dst.allocate()  # the mistake: a block already moved should be dst.incref'd instead
            src.decref(block)
            table.blocks[i] = new
            copies.append((block, new))
        table.allocator = dst
    return copies
