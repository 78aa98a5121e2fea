"""The step05 scheduler as a state machine, model-free: add, abort and step under a starved pool.

Hypothesis picks an engine (block size, a pool of a few blocks, preemption
mode, host pool, token budget) and then interleaves three rules: add a request
(greedy, seeded, parallel sampling ``n`` = 2-3, beam search width 2-3; prompts
and outputs around the block size), abort a live one, and run one iteration.
After every rule these must hold:

* **ownership** — on the device and on the host, the tables of the live
  sequences are the only owners of blocks: no block leaked, none free and
  mapped, every reference count equal to the table entries mapping it
  (``tests.invariants.check_allocator``);
* **coverage** — a running or swapped sequence's table holds exactly the
  blocks its K/V needs (``ceil(filled / B)``), and never more tokens than the
  sequence has; a waiting one holds none; a live sequence's status names its queue;
* **FCFS** — each queue is in arrival order; a request admitted or swapped in
  this iteration arrived before every one still waiting or swapped; nobody is
  admitted in an iteration that preempted, nor while a group is swapped out;
* **records** — an iteration's ``cow`` / ``swapped_out`` / ``swapped_in`` events are
  exactly its plan's copies and swaps, in order; its ``allocated`` blocks are distinct
  and sit in their sequence's table; a ``preempted`` group is in the queue its mode
  names; an abort's records open the next iteration's; every sequence is reported
  ``finished`` exactly once (``paged/step03_attention/events.py``).

At the end, with no more arrivals, every request that was not aborted must
finish within a bounded number of iterations, with at most ``max_tokens``
tokens per completion, and every device and host block must be free.
All checks are exact (integers). This file imports no torch and no model (the machine is
stepped with the stand-in runner; ``tests/test_torch_free.py`` checks it);
``test_scheduler_stateful.py`` runs the same machine over a real ``PreemptingEngine``.
"""

import math

from hypothesis import HealthCheck, settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from paged.sampling.sampling_params import SamplingParams
from tests.invariants import check_allocator
from tests.scheduler_harness import Harness, step05

VOCAB = 64
MAX_REQUESTS = 8
MAX_LEN = 64  # the context (the model's in test_scheduler_stateful.py)
FINISH_WITHIN = 3000  # iterations after the last arrival


class ModelFreeSchedulerMachine(RuleBasedStateMachine):
    """The same machine, rules and invariants over the scheduler alone: step05's scheduler
    stepped with the stand-in runner (``tests/scheduler_harness.py``), no model and no tensor.
    Thousands of iterations take seconds, so it runs five times the profile's examples."""

    @initialize(block_size=st.sampled_from([2, 4]), num_blocks=st.integers(6, 14),
                mode=st.sampled_from(["swap", "recompute", "auto"]), host_blocks=st.integers(0, 12),
                budget=st.sampled_from([None, 4, 9]))
    def start(self, block_size, num_blocks, mode, host_blocks, budget):
        self.engine = Harness(step05, num_blocks, block_size, preemption_mode=mode,
                              swap_blocks=host_blocks, max_num_batched_tokens=budget or 2048,
                              max_model_len=MAX_LEN)
        self.params: dict[str, SamplingParams] = {}
        self.aborted: set[str] = set()
        self.finished: dict[str, object] = {}
        self.seqs_finished: set[int] = set()  # the seq ids of every ``finished`` event so far
        self.seqs_seen: set[int] = set()  # the seq ids of every live sequence seen before a step
        self.aborted_since_step: list[str] = []  # their ``aborted`` records open the next iteration's


    @precondition(lambda self: len(self.params) < MAX_REQUESTS)
    @rule(data=st.data())
    def add(self, data):
        b = self.engine.block_size
        size = data.draw(st.sampled_from([1, b - 1, b, b + 1, 2 * b + 1]), label="prompt length")
        prompt = data.draw(st.lists(st.integers(3, VOCAB - 1), min_size=size, max_size=size), label="prompt")
        kind = data.draw(st.sampled_from(["greedy", "seeded", "parallel", "beam"]), label="kind")
        max_tokens = data.draw(st.integers(1, 3 * b), label="max_tokens")
        common = dict(max_tokens=max_tokens, ignore_eos=True)
        if kind == "greedy":
            params = SamplingParams(temperature=0, **common)
        elif kind == "seeded":
            params = SamplingParams(temperature=1.0, seed=data.draw(st.integers(0, 9)), **common)
        elif kind == "parallel":
            params = SamplingParams(n=data.draw(st.integers(2, 3)), temperature=1.0, seed=1, **common)
        else:
            width = data.draw(st.integers(2, 3), label="beam width")
            params = SamplingParams(n=data.draw(st.integers(1, width)), best_of=width, use_beam_search=True,
                                    temperature=0, **common)
        rid = f"r{len(self.params)}-{kind}"
        self.engine.add_request(rid, prompt, params, client=self.client(data), priority=self.priority(data))
        self.params[rid] = params

    def client(self, data) -> str:
        """Who sends the next request: one client here (``test_fair_share.py`` draws among several)."""
        return ""

    def priority(self, data) -> int:
        """The next request's priority: 0 here (``test_priority.py`` draws others)."""
        return 0

    @precondition(lambda self: any(r not in self.finished and r not in self.aborted for r in self.params))
    @rule(data=st.data())
    def abort(self, data):
        live = sorted(r for r in self.params if r not in self.finished and r not in self.aborted)
        rid = data.draw(st.sampled_from(live), label="abort")
        assert self.engine.abort(rid)
        self.aborted.add(rid)
        if self._records:
            self.aborted_since_step.append(rid)

    @rule()
    def step(self):
        if not self.engine.has_unfinished():
            return
        self._step()
        self._check_fcfs_decisions()

    @property
    def _records(self) -> bool:
        """Whether the records are checked: over the harness (``test_scheduler_stateful.py``'s engine
        keeps its own, which ``test_events.py`` checks)."""
        return isinstance(self.engine, Harness)

    def _step(self):
        e = self.engine
        if not self._records:
            for out in e.step():
                if out.finished:
                    self.finished[out.request_id] = out
            return
        self.seqs_seen |= {s.seq_id for r in e.requests.values() for s in r.seqs}
        for out in e.step():
            if out.finished:
                self.finished[out.request_id] = out
        self.seqs_seen |= {s.seq_id for r in e.requests.values() for s in r.seqs}
        aborted, self.aborted_since_step = self.aborted_since_step, []
        assert [ev.request_id for ev in e.events if ev.kind == "aborted"] == aborted
        kinds = [(ev.kind, ev.request_id in aborted) for ev in e.events]
        opening = [k for k in kinds[:len(kinds) - kinds[::-1].index(("aborted", True))]] if aborted else []
        assert all(mine for _, mine in opening), "an abort's records do not open the next iteration's"
        e.check_records(self.seqs_finished)

    def _check_fcfs_decisions(self):
        """The admissions and swap-ins of the iteration just run respected arrival order."""
        e = self.engine
        ids = {kind: [ev.request_id for ev in e.events if ev.kind == kind] for kind in ("admitted", "swapped_in")}
        if ids["admitted"]:
            assert not any(ev.kind == "preempted" for ev in e.events), "admitted in an iteration that preempted"
            assert not e.scheduler.swapped, "admitted while a group is swapped out"
        arrival = {r.request_id: r.arrival for r in e.requests.values()}  # the live ones
        for kind, queue in (("admitted", e.scheduler.waiting), ("swapped_in", e.scheduler.swapped)):
            for rid in ids[kind]:
                if rid in arrival:
                    assert all(arrival[rid] < r.arrival for r in queue), f"{rid} ({kind}) overtook an older one"

    # -- invariants after every rule --------------------------------------------
    def _live_tables(self, allocator):
        return [s.block_table for r in self.engine.requests.values() for s in r.seqs
                if not s.is_finished and s.block_table.allocator is allocator]

    @invariant()
    def blocks_are_owned_by_live_tables_only(self):
        if not hasattr(self, "engine"):
            return
        e = self.engine
        check_allocator(e.scheduler.kv.allocator, self._live_tables(e.scheduler.kv.allocator))
        check_allocator(e.scheduler.kv.host, self._live_tables(e.scheduler.kv.host))

    @invariant()
    def tables_cover_exactly_the_computed_tokens(self):
        if not hasattr(self, "engine"):
            return
        e = self.engine
        for queue in (e.scheduler.running, e.scheduler.swapped):
            for req in queue:
                for seq in req.seqs:
                    if seq.is_finished:
                        continue
                    t = seq.block_table
                    assert t.num_tokens <= seq.num_tokens
                    assert len(t.blocks) == math.ceil(t.num_tokens / e.scheduler.block_size), seq.seq_id
        for req in e.scheduler.waiting:
            assert all(not s.block_table.blocks and s.block_table.num_tokens == 0 for s in req.seqs)

    @invariant()
    def a_sequences_status_names_its_queue(self):
        if hasattr(self, "engine") and self._records:
            self.engine.check_statuses()

    @invariant()
    def queues_are_in_arrival_order(self):
        if not hasattr(self, "engine"):
            return
        e = self.engine
        for queue in (e.scheduler.waiting, e.scheduler.running, e.scheduler.swapped):
            arrivals = [r.arrival for r in queue]
            assert arrivals == sorted(arrivals)
        queued = [r.request_id for q in (e.scheduler.waiting, e.scheduler.running, e.scheduler.swapped) for r in q]
        assert len(queued) == len(set(queued)) == len(e.requests), "a request is lost or in two queues"

    def teardown(self):
        if not hasattr(self, "engine"):
            return
        e = self.engine
        for _ in range(FINISH_WITHIN):
            if not e.has_unfinished():
                break
            self._step()
            self.blocks_are_owned_by_live_tables_only()
            self.tables_cover_exactly_the_computed_tokens()
        assert not e.has_unfinished(), f"not finished within {FINISH_WITHIN} iterations"
        for rid, params in self.params.items():
            if rid in self.aborted:
                continue
            assert rid in self.finished, f"{rid} never finished"
            outs = self.finished[rid].outputs
            assert len(outs) == params.n
            assert all(len(o.token_ids) <= params.max_tokens for o in outs)
        assert e.scheduler.kv.allocator.num_used == 0 and e.scheduler.kv.host.num_used == 0, "blocks leaked"
        if self._records:  # the records of aborts after the last iteration wait for the next one: take them
            self.seqs_finished |= {ev.seq_id for ev in e.scheduler.take_events() if ev.kind == "finished"}
            assert self.seqs_seen <= self.seqs_finished, "a sequence left without a finished record"


ModelFreeSchedulerMachine.TestCase.settings = settings(
    max_examples=5 * settings().max_examples, stateful_step_count=25, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
test_scheduler_state_machine_model_free = ModelFreeSchedulerMachine.TestCase
