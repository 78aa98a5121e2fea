"""Step04's scheduling rules on the scheduler alone (no model): prefix lookups and groups.

``SharingScheduler`` with the stand-in runner (``tests/scheduler_harness.py``);
every equality is exact (token counts, positions, block ids).
"""

import pytest

from paged.step04_sharing import SharingScheduler
from tests.scheduler_harness import Harness

pytestmark = pytest.mark.step04

PROMPT = list(range(10, 19))  # 9 tokens: blocks [0..3] [4..7] [8]


@pytest.mark.parametrize("length, cached", [(8, 4), (9, 8), (4, 0), (5, 4)])
def test_rule_a_cached_prefix_never_covers_a_prompts_last_token(length, cached):
    """A prompt whose first blocks are cached maps them, except the block holding its last token,
    which is always computed (its logits are needed, and generated tokens must not write into a
    block another request may read): an 8-token prompt over two cached full blocks computes 4."""
    h = Harness(SharingScheduler, num_blocks=16)
    h.add(PROMPT, max_tokens=1, rid="first")
    h.run()
    h.add(PROMPT[:length], max_tokens=1, rid="again")
    it = h.tick()
    assert it.plan.positions[0] == cached and it.plan.query_lens == [length - cached]
    assert h.outputs["again"].num_cached_tokens == cached


def test_rule_a_group_computes_its_prompt_once_and_forks():
    """``n=3``: one sequence computes the 6-token prompt; its two siblings are forked in the same
    iteration and map the same 2 blocks (reference count 3), no block copied yet."""
    h = Harness(SharingScheduler, num_blocks=16)
    req = h.add(6, max_tokens=2, n=3, temperature=1.0, seed=1)
    it = h.tick()
    assert it.plan.query_lens == [6] and len(req.seqs) == 3
    tables = [s.block_table.blocks for s in req.seqs]
    assert tables[0] == tables[1] == tables[2] and len(tables[0]) == 2
    assert all(h.allocator.ref_count(b) == 3 for b in tables[0])
