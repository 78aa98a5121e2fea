"""The scheduler without a model: the scheduler of any step driven by step03's ``StandInRunner``.

``Harness`` is the engine's loop (schedule → execute → update) with the
runner replaced by the stand-in, so a scheduling test builds no model, no KV
tensor and no kernel: thousands of iterations take a second. It records
every plan and the events of every iteration, and checks the allocator
invariants (tests/invariants.py) when asked.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from paged.step02_block_table import SequenceStatus
from paged.step03_attention.request import StopChecker
from paged.sampling.sampling_params import SamplingParams
from paged.step03_attention.stand_in import StandInRunner
from paged.step03_attention.scheduler import build_scheduler as step03
from paged.step04_sharing.scheduler import build_scheduler as step04
from paged.step05_preemption.scheduler import build_scheduler as step05

__all__ = ["EOS", "ByteTokenizer", "Harness", "Iteration", "Lockstep", "NumberTokenizer", "step03", "step04", "step05"]

EOS = 2


class NumberTokenizer:
    """A stand-in tokenizer: a token list reads as its ids, space-separated (so texts can be checked)."""

    def decode(self, token_ids, skip_special_tokens: bool = True) -> str:
        return " ".join(str(t) for t in token_ids)


class ByteTokenizer:
    """A stand-in byte-level tokenizer: token ``3 + b`` is the byte ``b``, so a character of several UTF-8
    bytes takes several tokens, and a prefix that ends inside one decodes to U+FFFD, as with real
    byte-level BPE vocabularies."""

    def encode(self, text: str) -> list[int]:
        return [3 + b for b in text.encode()]

    def decode(self, token_ids, skip_special_tokens: bool = True) -> str:
        return bytes(t - 3 for t in token_ids if 3 <= t < 259).decode("utf-8", errors="replace")


@dataclass
class Iteration:
    """One iteration as the harness saw it."""

    plan: object  # the StepPlan
    touched: list  # requests that advanced or ended
    events: list  # EngineEvents, oldest first
    running_before: list = field(default_factory=list)  # request ids, arrival order
    swapped_before: list = field(default_factory=list)
    waiting_before: list = field(default_factory=list)

    def kinds(self, kind: str) -> list[str]:
        """Request ids of this iteration's ``kind`` events, in order (one per request)."""
        seen = []
        for e in self.events:
            if e.kind == kind and e.request_id not in seen:
                seen.append(e.request_id)
        return seen


class Harness:
    """A step's scheduler (its ``build_scheduler``) and a stand-in runner, stepped like an engine.

    Args:
        build: a step's ``build_scheduler`` (``step03``, ``step04``, ``step05`` of this module).
        num_blocks, block_size, max_num_seqs, max_num_batched_tokens: the pool and the budgets.
        max_model_len: the most tokens a sequence may hold.
        swap_blocks: host blocks, for step05's scheduler (its ``host_blocks``).
        eos_rate: how often the stand-in draws EOS (requests then stop early).
        runner: builds the stand-in from the scheduler (default: a ``StandInRunner`` with ``eos_rate``).
        tokenizer: what the stop checker detokenizes with (default: none, texts stay empty).
        **kwargs: more arguments of ``build`` (``preemption_mode=``, ``free_order=``, a component, ...).
    """

    def __init__(self, build, num_blocks: int, block_size: int = 4, *, max_num_seqs: int = 256,
                 max_num_batched_tokens: int = 2048, max_model_len: int = 4096, swap_blocks: int | None = None,
                 eos_rate: float = 0.0, runner=None, tokenizer=None, **kwargs) -> None:
        if swap_blocks is not None:
            kwargs["host_blocks"] = swap_blocks
        self.stops = StopChecker([EOS], max_model_len, tokenizer)
        self.scheduler = build(num_blocks, block_size, max_num_seqs=max_num_seqs,
                               max_num_batched_tokens=max_num_batched_tokens, stops=self.stops, **kwargs)
        self.runner = runner(self.scheduler) if runner else StandInRunner(eos=EOS, eos_rate=eos_rate)
        self.history: list[Iteration] = []
        self.events: list = []  # the last iteration's
        self.requests: dict[str, object] = {}  # the live ones, as engine.requests
        self.outputs: dict[str, object] = {}  # request id -> its last RequestOutput
        self._ids = itertools.count()

    # -- the engine's API, over the scheduler (what the engine does around it, minus the model) --
    def add_request(self, rid: str, prompt_token_ids: list[int], params: SamplingParams, client: str = "",
                    priority: int = 0):
        seed = params.seed if params.seed is not None else len(self.requests) + 1
        req = self.scheduler.add(rid, prompt_token_ids, params, seed=seed, client=client, priority=priority)
        self.requests[rid] = req
        return req

    def abort(self, rid: str) -> bool:
        req = self.requests.get(rid)
        if req is None or req.finished:
            return False
        self.scheduler.abort(req)
        del self.requests[rid]
        return True

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    def step(self) -> list:
        """One iteration: schedule, the stand-in's draws, update; returns the touched requests' outputs."""
        s = self.scheduler
        before = (self.ids(s.running), self.ids(s.swapped), self.ids(s.waiting))
        plan = s.schedule()
        results = self.runner.execute(plan)
        touched = s.update(plan, results)
        outs = []
        for req in touched:
            out = req.to_output()
            self.outputs[req.request_id] = out
            outs.append(out)
            if req.finished:
                self.requests.pop(req.request_id, None)
        self.events = s.take_events()
        self.history.append(Iteration(plan, touched, self.events, *before))
        return outs

    def tick(self) -> Iteration:
        """One iteration (``step``), returned as the harness saw it."""
        self.step()
        return self.history[-1]

    @property
    def last(self) -> Iteration:
        return self.history[-1]

    # shorthands for the scheduler's state
    block_size = property(lambda self: self.scheduler.block_size)
    running = property(lambda self: self.scheduler.running)
    waiting = property(lambda self: self.scheduler.waiting)
    swapped = property(lambda self: self.scheduler.swapped)
    allocator = property(lambda self: self.scheduler.kv.allocator)  # the device pool
    host = property(lambda self: self.scheduler.kv.host)  # step05's host pool

    # -- shorthands for the rule tests ---------------------------------------------------
    def add(self, prompt, max_tokens: int = 8, rid: str | None = None, client: str = "", priority: int = 0,
            **params):
        """Queue a request from ``client`` with ``priority``: ``prompt`` a token list or a length (tokens from its
        id); returns it."""
        rid = rid if rid is not None else f"r{next(self._ids)}"
        tokens = list(prompt) if not isinstance(prompt, int) else [3 + (7 * len(rid) + i) % 1000 for i in range(prompt)]
        params.setdefault("temperature", 0.0)
        return self.add_request(rid, tokens, SamplingParams(max_tokens=max_tokens, **params), client, priority)

    def ids(self, queue) -> list[str]:
        return [r.request_id for r in queue]

    def plan_seq(self, it: Iteration, rid: str) -> bool:
        """Whether a sequence of request ``rid`` is in iteration ``it``'s plan."""
        return any(e.request_id == rid for e in it.events if e.kind == "admitted") or any(
            s.seq_id in it.plan.seq_ids for r in it.touched + self.scheduler.running if r.request_id == rid
            for s in r.seqs)

    def run(self, max_iterations: int = 10_000) -> list[Iteration]:
        """Step until nothing is left; fails (instead of hanging) after ``max_iterations``."""
        start = len(self.history)
        for _ in range(max_iterations):
            if not self.scheduler.has_unfinished():
                return self.history[start:]
            self.step()
        raise AssertionError(f"still unfinished after {max_iterations} iterations: "
                             f"running {self.ids(self.scheduler.running)}, waiting {self.ids(self.scheduler.waiting)}")

    def check_records(self, finished: set) -> None:
        """The last iteration's records agree with its plan, the tables and the queues (``events.py``):
        ``cow`` / ``swapped_out`` / ``swapped_in`` are exactly the plan's copies and swaps, in order;
        ``allocated`` blocks are distinct and sit in their sequence's table; a ``preempted`` group is in
        the queue its mode names; no sequence is ``finished`` twice (``finished``: the seq ids so far)."""
        s, plan, events = self.scheduler, self.last.plan, self.events
        of = lambda kind: [ev for ev in events if ev.kind == kind]  # noqa: E731
        assert [(ev.detail["src"], ev.detail["dst"]) for ev in of("cow")] == plan.blocks_to_copy
        assert [m for ev in of("swapped_out") for m in ev.detail["blocks"]] == plan.blocks_to_swap_out
        assert [m for ev in of("swapped_in") for m in ev.detail["blocks"]] == plan.blocks_to_swap_in
        fresh = [b for ev in of("allocated") for b in ev.detail["blocks"]]
        assert len(fresh) == len(set(fresh)), "a block was handed out twice in one iteration"
        ended = {ev.seq_id for ev in of("finished")}
        tables = {q.seq_id: q.block_table.blocks for r in s.running for q in r.seqs}
        for ev in of("allocated"):
            if ev.seq_id not in ended:
                assert set(ev.detail["blocks"] + ev.detail["cached"]) <= set(tables[ev.seq_id]), ev
        for ev in of("preempted"):
            req = self.requests.get(ev.request_id)
            if req is not None:  # not ended later in the iteration: in the queue its mode names
                assert req in (s.swapped if ev.detail["mode"] == "swap" else s.waiting), ev
        for ev in of("finished"):
            assert ev.seq_id not in finished, f"sequence {ev.seq_id} finished twice"
            finished.add(ev.seq_id)

    def check_statuses(self) -> None:
        """A live sequence's status names its queue. (A group swapped in without slots this iteration —
        its blocks back, its tokens not yet — is still marked swapped until it runs.)"""
        s = self.scheduler
        for queue, status in ((s.running, {SequenceStatus.RUNNING, SequenceStatus.SWAPPED}),
                              (s.swapped, {SequenceStatus.SWAPPED}),
                              (s.waiting, {SequenceStatus.WAITING})):
            for req in queue:
                assert {q.status for q in req.seqs if not q.is_finished} <= status, (req.request_id, status)

    def finish_reasons(self, rid: str) -> list:
        req = self.requests.get(rid) or self._finished(rid)
        return [s.finish_reason for s in req.seqs]

    def _finished(self, rid: str):
        for it in self.history:
            for req in it.touched:
                if req.request_id == rid:
                    return req
        raise KeyError(rid)


class Lockstep(Harness):
    """A harness with the order component ``order`` that steps a first-come-first-served twin beside it and
    checks, after every iteration, that both planned, recorded and answered the same (exact ``==``)."""

    def __init__(self, order, *args, **kwargs) -> None:
        super().__init__(*args, order=order, **kwargs)
        self.twin = Harness(*args, **kwargs)

    def add_request(self, rid, prompt_token_ids, params, client="", priority=0):
        self.twin.add_request(rid, prompt_token_ids, params, client, priority)
        return super().add_request(rid, prompt_token_ids, params, client, priority)

    def abort(self, rid):
        assert self.twin.abort(rid) == (done := super().abort(rid))
        return done

    def step(self):
        outs, twin = super().step(), self.twin.step()
        assert self.last.plan == self.twin.last.plan
        assert self.events == self.twin.events
        assert outs == twin
        return outs
