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

from paged.step05_preemption import SwapSpace, copy_between
from tests.invariants import check_allocator
from tests.step04_sharing.test_sharing_stateful import SharingMachine


class PreemptionMachine(SharingMachine):
    def _swap(self):
        if not hasattr(self, "swap"):
            self.swap = SwapSpace(12, self.cache)
            self.out = {}  # name -> (table, tokens) living in host memory
        return self.swap

    @rule(data=st.data())
    def swap_out(self, data):
        if not getattr(self, "live", None):
            return
        name = data.draw(st.sampled_from(sorted(self.live)))
        table, tokens = self.live[name]
        swap = self._swap()
        if SwapSpace.distinct_blocks([table]) > swap.allocator.num_free:
            return
        copy_between(self.cache, swap.cache, swap.swap_out([table], self.bm.allocator))
        self.out[name] = self.live.pop(name)

    @rule(data=st.data())
    def swap_in(self, data):
        if not getattr(self, "out", None):
            return
        name = data.draw(st.sampled_from(sorted(self.out)))
        table, tokens = self.out[name]
        if SwapSpace.distinct_blocks([table]) > self.bm.num_free:
            return
        copy_between(self.swap.cache, self.cache, self.swap.swap_in([table], self.bm.allocator))
        self.live[name] = self.out.pop(name)

    @rule(data=st.data())
    def recompute(self, data):
        if not getattr(self, "live", None):
            return
        name = data.draw(st.sampled_from(sorted(self.live)))
        table, tokens = self.live[name]
        self.bm.free(table)
        if self.bm.blocks_needed_for_prompt(tokens) > self.bm.num_free:
            del self.live[name]  # cannot come back now: it stays dropped (nothing held)
            return
        cached, slots = self.bm.allocate_prompt(table, tokens)
        self._write(table, tokens, cached, slots)

    @invariant()
    def host_reference_counts_match(self):
        if not hasattr(self, "swap"):
            return
        check_allocator(self.swap.allocator, [table for table, _ in self.out.values()])

    def teardown(self):
        if hasattr(self, "swap"):
            for table, _ in self.out.values():
                table.free()
            assert self.swap.allocator.num_used == 0
        super().teardown()


TestPreemptionMachine = PreemptionMachine.TestCase
TestPreemptionMachine.settings = settings(settings(), max_examples=20, stateful_step_count=25)
