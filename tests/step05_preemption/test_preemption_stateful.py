"""The step04 shadow-model machine, extended with swap-out, swap-in and recompute.

Extra rules move a sequence's blocks to a host pool (sharing preserved) and
back, or drop them and recompute the sequence's K/V from its tokens. After
every rule, every sequence on the device still attends exactly like contiguous
attention over its shadow (**bitwise**: reference path), host and device
reference counts equal the table entries that map them, and at the end every
device and host block is free.
"""

from hypothesis import settings, strategies as st
from hypothesis.stateful import invariant, rule

from paged.step02_block_table import KVCache, Sequence
from paged.step05_preemption import SwappingKVManager, copy_between
from tests.invariants import check_allocator
from tests.step04_sharing.test_sharing_stateful import SharingMachine


def _seq(table, tokens) -> Sequence:
    """The sequence the scheduler would hand the KV manager: ``table`` holding ``tokens``."""
    return Sequence(0, tokens, table)


class PreemptionMachine(SharingMachine):
    HOST_BLOCKS = 12

    def _swap(self) -> KVCache:
        """The host pool: its block ids in a ``SwappingKVManager`` over the machine's device allocator, its
        memory a second ``KVCache`` shaped like the device's (the runner's half)."""
        if not hasattr(self, "host_cache"):
            kv, c = SwappingKVManager(1, self.bm.block_size, self.HOST_BLOCKS), self.cache
            kv.allocator = self.bm.allocator
            self.kv = kv
            self.host_cache = KVCache(c.num_layers, self.HOST_BLOCKS, c.block_size, c.num_kv_heads, c.head_dim,
                                      c.dtype, "cpu")
            self.out = {}  # name -> (table, tokens) living in host memory
        return self.host_cache

    @rule(data=st.data())
    def swap_out(self, data):
        if not getattr(self, "live", None):
            return
        name = data.draw(st.sampled_from(sorted(self.live)))
        table, tokens = self.live[name]
        host = self._swap()
        seq = _seq(table, tokens)
        if self.kv.distinct_blocks([seq]) > self.kv.host.num_free:
            return
        copy_between(self.cache, host, self.kv.swap_out([seq]))
        self.out[name] = self.live.pop(name)

    @rule(data=st.data())
    def swap_in(self, data):
        if not getattr(self, "out", None):
            return
        name = data.draw(st.sampled_from(sorted(self.out)))
        table, tokens = self.out[name]
        seq = _seq(table, tokens)
        if self.kv.distinct_blocks([seq]) > self.bm.num_free:
            return
        copy_between(self.host_cache, self.cache, self.kv.swap_in([seq]))
        self.live[name] = self.out.pop(name)

    @rule(data=st.data())
    def recompute(self, data):
        if not getattr(self, "live", None):
            return
        name = data.draw(st.sampled_from(sorted(self.live)))
        table, tokens = self.live[name]
        table.free()
        if self.bm.blocks_needed_for_prompt(tokens) > self.bm.num_free:
            del self.live[name]  # cannot come back now: it stays dropped (nothing held)
            return
        cached, slots = self.bm.allocate_prompt(table, tokens)
        self._write(table, tokens, cached, slots)

    @invariant()
    def host_reference_counts_match(self):
        if not hasattr(self, "kv"):
            return
        check_allocator(self.kv.host, [table for table, _ in self.out.values()])

    def teardown(self):
        if hasattr(self, "kv"):
            for table, _ in self.out.values():
                table.free()
            assert self.kv.host.num_used == 0
        super().teardown()


TestPreemptionMachine = PreemptionMachine.TestCase
TestPreemptionMachine.settings = settings(settings(), max_examples=20, stateful_step_count=25)
