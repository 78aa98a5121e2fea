"""Fork / append / free / copy-on-write / prefix caching against a shadow contiguous model.

A ``RuleBasedStateMachine`` drives a ``SharingKVManager``'s tables and a paged ``KVCache``
the way the engine does — allocate a prompt (mapping cached blocks), append
tokens, fork, free — while a shadow keeps each live sequence's K/V as a plain
contiguous tensor. The K/V of a token is a pure function of the token ids up to
it (a hash-seeded draw), as in a real model, so a prefix-cache hit must return
exactly the shadow's values.

After every rule (the invariants of docs/architecture.md):

* each live sequence's paged attention (reference path) equals contiguous
  attention over its shadow, **bitwise** (gather then the oracle's arithmetic);
* every block's reference count equals the number of table entries mapping it;
* no table writes into a block another table maps (copy-on-write happened);
* free + used = total; after the teardown every block is free.
"""

import functools

import torch
from hypothesis import settings, strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, consumes, initialize, invariant, rule

from paged.step02_block_table import KVCache
from paged.step03_attention import reference_attention
from paged.step04_sharing import SharingKVManager, copy_blocks
from tests.invariants import check_allocator, failing
from tests.oracle import contiguous_attention

H, H_KV, D = 2, 1, 8
SCALE = D**-0.5
VOCAB = 3  # few distinct tokens so prompts share prefixes often


@functools.lru_cache(maxsize=None)
def kv_of(prefix: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    """K and V [H_kv, D] of the last token of ``prefix``: a function of the whole prefix."""
    g = torch.Generator().manual_seed(hash(prefix) % 2**62)
    return torch.randn(H_KV, D, dtype=torch.float64, generator=g), torch.randn(H_KV, D, dtype=torch.float64, generator=g)


class SharingMachine(RuleBasedStateMachine):
    seqs = Bundle("seqs")

    @initialize(block_size=st.sampled_from([1, 2, 4]), num_blocks=st.integers(4, 24),
                caching=st.booleans(), data=st.data())
    def setup(self, block_size, num_blocks, caching, data):
        order = data.draw(st.permutations(list(range(num_blocks))))
        self.bm = SharingKVManager(num_blocks, block_size, caching, free_order=order)
        self.cache = KVCache(1, num_blocks, block_size, H_KV, D, torch.float64)
        self.live = {}  # name -> (table, tokens)
        self.next = 0

    def _write(self, table, tokens, start, slots):
        copies = table.take_copies()
        if copies:
            copy_blocks(self.cache, copies)
        kv = [kv_of(tuple(tokens[: p + 1])) for p in range(start, len(tokens))]
        k = torch.stack([a for a, _ in kv])
        v = torch.stack([b for _, b in kv])
        self.cache.write(0, k, v, torch.tensor(slots))
        self.bm.register_full_blocks(table, tokens)

    @rule(target=seqs, prompt=st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=12))
    def new_sequence(self, prompt):
        """A new sequence's prompt gets its blocks (cached ones mapped), or, when the pool is short,
        nothing changes."""
        if self.bm.blocks_needed_for_prompt(prompt) > self.bm.num_free:
            before = self.bm.allocator.free_blocks()
            table = self.bm.new_table()
            try:
                self.bm.allocate_prompt(table, prompt)
            except Exception:
                pass
            else:
                raise AssertionError("allocate_prompt succeeded although blocks_needed said it cannot")
            assert sorted(self.bm.allocator.free_blocks()) == sorted(before) and not table.blocks
            return None
        table = self.bm.new_table()
        cached, slots = self.bm.allocate_prompt(table, prompt)
        assert cached % self.bm.block_size == 0 and cached < len(prompt)
        self._write(table, prompt, cached, slots)
        name = self.next = self.next + 1
        self.live[name] = (table, list(prompt))
        return name

    @rule(seq=seqs, new=st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=5))
    def append(self, seq, new):
        """Appending tokens to a sequence writes only blocks it alone maps (copy-on-write first)."""
        if seq not in self.live:
            return
        table, tokens = self.live[seq]
        if table.slots_for(len(new)) > self.bm.num_free:
            return
        start = len(tokens)
        tokens += new
        self._write(table, tokens, start, table.append(len(new)))

    @rule(seq=seqs)
    def append_nothing(self, seq):
        """``append(0)`` (a sequence with no new token this iteration) changes nothing: no block
        taken, no copy queued, no slot returned — even when its last block is shared."""
        if seq not in self.live:
            return
        table, _ = self.live[seq]
        before = list(table.blocks), self.bm.allocator.free_blocks(), self.bm.allocator.ref_counts()
        slots = table.append(0)
        assert slots == [], f"append(0) returned slots {slots}; no token, no slot"
        assert not table.pending_copies, (
            f"append(0) queued the copy {table.pending_copies[0]}: copy-on-write must wait for a token to write")
        after = list(table.blocks), self.bm.allocator.free_blocks(), self.bm.allocator.ref_counts()
        assert after == before, (f"append(0) changed the table {before[0]} -> {after[0]} or the pool; "
                                 "with no token to write it must change nothing")

    @rule(target=seqs, seq=seqs)
    def fork(self, seq):
        """A fork maps its parent's blocks (each one more reference) and has its parent's tokens."""
        if seq not in self.live:
            return None
        table, tokens = self.live[seq]
        name = self.next = self.next + 1
        self.live[name] = (table.fork(), list(tokens))
        return name

    @rule(seq=consumes(seqs))
    def free(self, seq):
        """Freeing a sequence drops one reference on each of its blocks."""
        if seq in self.live:
            table, _ = self.live.pop(seq)
            table.free()

    @invariant()
    def reference_counts_match_table_entries(self):
        """After every call, every block's reference count equals the number of table entries that
        map it, and a block is free exactly when no table maps it."""
        if not hasattr(self, "bm"):
            return
        check_allocator(self.bm.allocator, [table for table, _ in self.live.values()])

    @invariant()
    def paged_attention_equals_shadow_bitwise(self):
        """After every call, each sequence reads back exactly its own tokens' K/V: its paged attention
        equals contiguous attention over them, bitwise (a write into a block another sequence maps
        changes that sequence's answer)."""
        if not hasattr(self, "bm"):
            return
        for name, (table, tokens) in self.live.items():
            assert table.num_tokens == len(tokens), (
                f"sequence {name}'s table holds {table.num_tokens} tokens; it was given {len(tokens)}")
            k = torch.stack([kv_of(tuple(tokens[: p + 1]))[0] for p in range(len(tokens))])
            v = torch.stack([kv_of(tuple(tokens[: p + 1]))[1] for p in range(len(tokens))])
            q = torch.randn(1, H, D, dtype=torch.float64, generator=torch.Generator().manual_seed(name))
            out = reference_attention(q, self.cache.key(0), self.cache.value(0),
                                      torch.tensor([table.blocks]), torch.tensor([len(tokens)]), None, SCALE)
            assert torch.equal(out, contiguous_attention(q, k, v, SCALE)), (
                f"sequence {name} (blocks {table.blocks}, {len(tokens)} tokens) reads K/V that are not its own: "
                "a block it maps was written by another sequence")

    def teardown(self):
        """When every sequence is freed, every block is free."""
        if hasattr(self, "bm") and not failing():
            for table, _ in self.live.values():
                table.free()
            assert self.bm.num_free == self.bm.allocator.num_blocks, (
                f"every sequence freed, yet {self.bm.allocator.num_used} block(s) still used: a reference leaked")


TestSharingMachine = SharingMachine.TestCase
# half the profile's examples (each runs paged attention per live sequence after every rule): 20 under ci
TestSharingMachine.settings = settings(settings(), max_examples=settings().max_examples // 2, stateful_step_count=25)
