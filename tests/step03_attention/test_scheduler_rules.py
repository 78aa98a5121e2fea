"""Step03's scheduling rules, one deterministic test each, on the scheduler alone (no model, no tensor).

Each test builds a tiny pool (block size 4) and a few requests whose block
needs are counted by hand in its docstring, steps step03's scheduler (the loop with
step03's components) with the stand-in runner (``tests/scheduler_harness.py``) and checks the one decision
the rule makes. The equalities are exact: queues, events, plans are integers
and ids.
"""

import logging

import pytest

from paged.errors import RequestError
from paged.step03_attention.policies import Reservation
from tests.scheduler_harness import ByteTokenizer, Harness, step03

pytestmark = pytest.mark.step03


def test_rule_fcfs_admission_without_overtaking():
    """4 blocks: A takes 3 (12 tokens), B needs 2 — so B waits, and C (1 block, which is free)
    waits behind it; when A ends, B then C start, in arrival order."""
    h = Harness(step03, num_blocks=4)
    h.add(12, max_tokens=2, rid="A")
    h.add(8, max_tokens=1, rid="B")
    h.add(2, max_tokens=1, rid="C")
    first = h.tick()
    assert first.kinds("admitted") == ["A"] and first.plan.seq_ids == [0]
    assert h.ids(h.waiting) == ["B", "C"] and h.allocator.num_free == 1
    second = h.tick()  # A's last token; it holds its blocks while this iteration is decided
    assert second.kinds("admitted") == [] and h.finish_reasons("A") == ["length"]
    third = h.tick()
    assert third.kinds("admitted") == ["B", "C"] and third.plan.query_lens == [8, 2]


def _pressure():
    """4 blocks: A (3 tokens, 1 block), B (1 token, 1 block), X (5 tokens, 2 blocks) all start in
    iteration 1. In iteration 3 A's fifth token needs a new block and none is free."""
    h = Harness(step03, num_blocks=4)
    h.add(3, max_tokens=10, rid="A")
    h.add(1, max_tokens=10, rid="B")
    h.add(5, max_tokens=10, rid="X")
    h.tick()
    h.tick()
    assert h.ids(h.running) == ["A", "B", "X"] and h.allocator.num_free == 0
    return h


def test_rule_the_newest_running_group_is_the_victim(caplog):
    """A, the oldest, needs a block: X (the newest) is evicted, not B — step03 cannot preempt, so X
    ends with ``kv_cache_exhausted`` and its 2 blocks are free at once; A and B go on. The operator's
    log names X and why."""
    h = _pressure()
    with caplog.at_level(logging.WARNING, logger="paged"):
        it = h.tick()
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [
        ("WARNING", "KV cache exhausted: ended request X (step05 adds preemption)")]
    assert it.kinds("finished") == ["X"] and h.finish_reasons("X") == ["kv_cache_exhausted"]
    assert h.ids(h.running) == ["A", "B"]
    assert [h.plan_seq(it, r) for r in ("A", "B")] == [True, True]
    assert h.allocator.num_free == 1  # X's 2 blocks, one of them now A's


def test_rule_no_admission_in_an_iteration_that_evicted():
    """C (1 block) arrives before the iteration that evicts X; that eviction leaves a block free,
    but C starts only in the next iteration: no newcomer takes the room an older request just lost."""
    h = _pressure()
    h.add(1, max_tokens=2, rid="C")
    it = h.tick()
    assert it.kinds("finished") == ["X"] and h.allocator.num_free == 1
    assert it.kinds("admitted") == [] and h.ids(h.waiting) == ["C"]
    assert h.tick().kinds("admitted") == ["C"]


def test_rule_a_request_larger_than_the_pool_is_ended_and_the_next_one_starts(caplog):
    """A prompt needing 3 blocks of a 2-block pool can never run: it ends at once (``length``),
    freeing nothing and holding nobody up — the request behind it starts in the same iteration.
    The operator's log names it and the pool's size."""
    h = Harness(step03, num_blocks=2)
    h.add(9, rid="big")
    h.add(2, max_tokens=1, rid="small")
    with caplog.at_level(logging.WARNING, logger="paged"):
        it = h.tick()
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [
        ("WARNING", "request big needs more KV blocks than the cache has (2); ending it")]
    assert h.finish_reasons("big") == ["length"] and it.kinds("admitted") == ["small"]
    assert not h.waiting and h.outputs["big"].finished


def test_rule_a_request_that_outgrows_the_pool_alone_is_ended():
    """One request whose generation needs a third block of a 2-block pool: with nobody to evict it
    evicts itself (``kv_cache_exhausted``) instead of waiting forever, and every block is free."""
    h = Harness(step03, num_blocks=2)
    h.add(7, max_tokens=10, rid="A")
    h.run(max_iterations=10)
    assert h.finish_reasons("A") == ["kv_cache_exhausted"] and h.allocator.num_free == 2


def test_rule_the_token_budget_holds_a_prompt_back_whole():
    """Step03 computes a prompt in one iteration: with a budget of 8 tokens, A's 6 start, and B's 4
    (6 + 4 > 8) wait for the next iteration, FCFS."""
    h = Harness(step03, num_blocks=16, max_num_batched_tokens=8)
    h.add(6, max_tokens=1, rid="A")
    h.add(4, max_tokens=1, rid="B")
    it = h.tick()
    assert it.kinds("admitted") == ["A"] and it.plan.query_lens == [6]
    assert h.tick().kinds("admitted") == ["B"]


def test_rule_the_reservation_is_asked_at_admission_and_told_at_retirement():
    """The admission component: a policy that says no keeps the head of the queue (and everyone behind it)
    waiting although its blocks are free; ``release`` comes once per request, when it retires."""

    class Log(Reservation):
        def __init__(self):
            self.allow, self.asked, self.released = False, [], []

        def reserve(self, req):
            self.asked.append(req.request_id)
            return self.allow

        def release(self, req):
            self.released.append(req.request_id)

    log = Log()
    h = Harness(step03, num_blocks=8, admission=log)
    h.add(2, max_tokens=1, rid="A")
    h.add(2, max_tokens=1, rid="B")
    assert h.tick().kinds("admitted") == [] and log.asked == ["A"]
    log.allow = True
    assert h.tick().kinds("admitted") == ["A", "B"] and log.asked == ["A", "A", "B"]
    assert log.released == ["A", "B"] and h.allocator.num_free == 8


def test_rule_the_sequence_budget_caps_the_batch_fcfs():
    """``max_num_seqs=2``: of three one-block requests with room for all, exactly the first two run
    in an iteration; the third starts when one of them ends."""
    h = Harness(step03, num_blocks=16, max_num_seqs=2)
    h.add(2, max_tokens=1, rid="A")
    h.add(2, max_tokens=3, rid="B")
    h.add(2, max_tokens=1, rid="C")
    assert h.tick().kinds("admitted") == ["A", "B"] and h.ids(h.waiting) == ["C"]
    assert h.tick().kinds("admitted") == ["C"]


def test_rule_a_request_needing_exactly_the_pool_runs():
    """The bound of "larger than the pool" is strict: an 8-token prompt fills a 2-block pool exactly,
    and it runs (its first sampled token then needs a third block: it is ended for the cache, not for
    its length, in the next iteration)."""
    h = Harness(step03, num_blocks=2)
    h.add(8, max_tokens=4, rid="A")
    assert h.tick().kinds("admitted") == ["A"] and h.allocator.num_free == 0
    h.run(max_iterations=3)
    assert h.finish_reasons("A") == ["kv_cache_exhausted"]


def test_rule_the_budgets_admit_a_request_that_fits_them_exactly():
    """Budgets are inclusive: with 8 tokens and 2 sequences an iteration, a 6-token and a 2-token prompt
    start together, and a third one-token request waits for the next iteration."""
    h = Harness(step03, num_blocks=16, max_num_batched_tokens=8, max_num_seqs=2)
    h.add(6, max_tokens=1, rid="A")
    h.add(2, max_tokens=1, rid="B")
    h.add(1, max_tokens=1, rid="C")
    it = h.tick()
    assert it.kinds("admitted") == ["A", "B"] and it.plan.query_lens == [6, 2]
    assert h.tick().kinds("admitted") == ["C"]


def test_rule_a_pool_holds_at_least_one_block():
    """A pool of one block serves a request that fits it; a pool of none is refused at construction."""
    h = Harness(step03, num_blocks=1)
    h.add(2, max_tokens=2, rid="A")
    h.run(max_iterations=3)
    assert h.outputs["A"].outputs[0].finish_reason == "length" and h.allocator.num_free == 1
    with pytest.raises(ValueError, match="num_blocks must be >= 1"):
        Harness(step03, num_blocks=0)


def test_rule_prompt_tokens_total_counts_each_computed_prompt_token_once():
    """``prompt_tokens_total`` (for /metrics) grows by the prompt tokens an iteration computes: 6 + 4
    when two prompts start, nothing for a decode."""
    h = Harness(step03, num_blocks=16)
    h.add(6, max_tokens=3, rid="A")
    h.add(4, max_tokens=3, rid="B")
    h.tick()
    assert h.scheduler.prompt_tokens_total == 10
    h.run()
    assert h.scheduler.prompt_tokens_total == 10


@pytest.mark.parametrize("block_size, expected", [
    (4, [[5, 2], [], [], [], [7]]),  # 5 prompt tokens in two blocks; positions 5-7 fit; 8 takes a third
    (1, [[5, 2, 7, 0, 1], [3], [4], [6], []]),  # a block per token, until the pool is spent
])
def test_rule_allocated_records_name_each_new_block(block_size, expected):
    """The ``allocated`` record lists the blocks a table gained, in table order and free-list order, none
    of them cached (step03 has no prefix cache); an iteration that takes no block records nothing."""
    h = Harness(step03, num_blocks=8, block_size=block_size, free_order=[5, 2, 7, 0, 1, 3, 4, 6])
    req = h.add(5, max_tokens=5, rid="A")
    records = [[(ev.seq_id, ev.detail) for ev in h.tick().events if ev.kind == "allocated"] for _ in range(5)]
    seq = req.seqs[0].seq_id
    assert records == [[(seq, {"blocks": b, "cached": []})] if b else [] for b in expected]


class _FailingSampling:
    """A stand-in for the engine's ``SamplingStates``: the state of request ``failed`` fails with ``error``
    when the plan's contexts are attached; no other request processes logits."""

    def __init__(self, error):
        self.error = error

    def attach(self, plan, requests):
        return {r.request_id: self.error for r in requests if r.request_id == "failed"}

    def collect(self, requests, results):
        pass


def test_rule_a_failed_request_ends_alone(caplog):
    """A request whose own processing failed ends with ``finish_reason="error"`` and its error, its
    blocks free at once; the others go on. Three ways: its sampling state fails as the scheduler
    attaches it to the plan, its row carries an error, or recording its token raises (here: a token
    id that is no token)."""
    bad = RequestError("a logits processor refused", param="logits_processors")
    h = Harness(step03, num_blocks=16, sampling=_FailingSampling(bad))
    for rid in ("ok", "failed", "row", "record"):
        h.add(3, max_tokens=4, rid=rid)
    s = h.scheduler
    plan = s.schedule()
    results = h.runner.execute(plan)
    seq = {r.request_id: r.seqs[0].seq_id for r in s.running}
    results[seq["row"]].error = RuntimeError("a grammar broke")
    results[seq["record"]].token_id = -1
    with caplog.at_level(logging.WARNING, logger="paged"):
        touched = s.update(plan, results)
    assert sorted(r.request_id for r in touched) == ["failed", "ok", "record", "row"]
    assert h.ids(s.running) == ["ok"] and h.allocator.num_used == 1
    ended = {r.request_id: r for r in touched if r.finished}
    assert sorted(ended) == ["failed", "record", "row"]
    assert ended["failed"].error is bad and isinstance(ended["row"].error, RuntimeError)
    assert isinstance(ended["record"].error, ValueError)
    assert all(r.to_output().outputs[0].finish_reason == "error" for r in ended.values())
    # a bad request is the client's (a warning, its message); any other failure is a bug (an error, its traceback)
    logged = [(r.levelname, r.getMessage(), r.exc_info and r.exc_info[1]) for r in caplog.records]
    assert logged == [("WARNING", "request failed failed: a logits processor refused", None),
                      ("ERROR", "request row failed", ended["row"].error),
                      ("ERROR", "request record failed", ended["record"].error)]


def test_rule_abort_frees_a_request_wherever_it_is():
    """``abort`` ends a running or a waiting request at once (``finish_reason="abort"``), frees its blocks,
    and records ``aborted`` then ``finished``; the others are untouched."""
    h = Harness(step03, num_blocks=2)
    running = h.add(5, max_tokens=4, rid="running")
    waiting = h.add(5, max_tokens=4, rid="waiting")
    h.tick()
    assert h.ids(h.running) == ["running"] and h.ids(h.waiting) == ["waiting"]
    h.scheduler.abort(waiting)
    h.scheduler.abort(running)
    assert not h.scheduler.has_unfinished() and h.allocator.num_free == 2
    assert [(ev.kind, ev.request_id) for ev in h.scheduler.take_events()] == [
        ("aborted", "waiting"), ("finished", "waiting"), ("aborted", "running"), ("finished", "running")]
    assert [r.seqs[0].finish_reason for r in (running, waiting)] == ["abort", "abort"]


def test_rule_update_reports_only_the_requests_that_advanced():
    """A running request the budgets hold back this iteration draws nothing, so ``update`` does not
    report it; the output of one that advanced carries its prompt, completion index 0, and no text yet."""
    h = Harness(step03, num_blocks=16)
    h.add(3, max_tokens=4, rid="A")
    h.add(3, max_tokens=4, rid="B")
    h.tick()
    h.scheduler.max_num_seqs = 1
    it = h.tick()
    assert [r.request_id for r in it.touched] == ["A"]
    req = h.scheduler.add("C", [5, 6, 7], h.running[0].params, seed=1, prompt="five six seven")
    out = req.to_output()
    assert out.prompt == "five six seven" and [(o.index, o.text, o.token_ids) for o in out.outputs] == [(0, "", [])]


def test_rule_retiring_a_request_costs_the_same_whatever_waits_behind_it(monkeypatch):
    """A request leaves the queue that holds it (``Request.queue``), found by identity: retiring the
    running one compares it with no request of the waiting queue, so 20 or 2 000 requests waiting
    behind cost the same number of request comparisons (none here). (A scan of the waiting queue by
    dataclass equality made each retirement cost a comparison per waiting request.)"""
    from paged.step03_attention.request import Request

    compared = []

    def counting_eq(self, other):
        compared.append(1)
        return self is other

    monkeypatch.setattr(Request, "__eq__", counting_eq)

    def comparisons(waiting: int) -> int:
        h = Harness(step03, num_blocks=8, max_num_seqs=1)
        for i in range(waiting + 1):
            h.add(2, max_tokens=1, rid=f"r{i}")
        h.tick()  # r0 starts, draws its one token and retires
        compared.clear()
        h.tick()  # r1 does the same
        assert h.outputs["r1"].finished and len(h.waiting) == waiting - 1
        return len(compared)

    assert comparisons(20) == comparisons(2000) == 0


class _Scripted:
    """A stand-in runner whose every sequence draws the tokens of ``script``, in order."""

    def __init__(self, script):
        self.script = script

        self.drawn: dict[int, int] = {}  # seq id -> tokens drawn so far

    def execute(self, plan):
        from paged.sampling.result import SampleResult

        out = {}
        for i, seq_id in enumerate(plan.seq_ids):
            if plan.sample[i]:
                n = self.drawn.get(seq_id, 0)
                self.drawn[seq_id] = n + 1
                out[seq_id] = SampleResult(self.script[n])
        return out


def test_rule_a_stop_string_matches_only_text_decoded_for_good():
    """A stop string of U+FFFD, the character a half-generated multi-byte character decodes to: an answer
    whose characters take several tokens each (``漢字``, byte-level) is not cut while a character is half
    done — it runs to ``max_tokens`` and its text holds no U+FFFD; the same stop string still ends an
    answer at a real U+FFFD (a whole character), and an ordinary stop string still ends one at once."""
    tok = ByteTokenizer()
    text = " 漢字漢字 🙂 ok"

    def answer(script, stop):
        h = Harness(step03, num_blocks=32, tokenizer=tok, runner=lambda s: _Scripted(script))
        h.add(3, max_tokens=len(script), rid="A", stop=[stop])
        h.run(max_iterations=50)
        return h.outputs["A"].outputs[0]

    out = answer(tok.encode(text), "\ufffd")
    assert (out.finish_reason, out.text) == ("length", text)
    out = answer(tok.encode(" ok \ufffd more"), "\ufffd")
    assert (out.finish_reason, out.stop_reason, out.text) == ("stop", "\ufffd", " ok ")
    out = answer(tok.encode(text), "字")
    assert (out.finish_reason, out.text) == ("stop", " 漢")


def test_rule_an_eviction_answer_that_is_no_reason_is_refused_naming_the_request():
    """The loop carries out what the eviction component answers: ``"swap"``, ``"recompute"`` or a finish
    reason. Anything else (None, a number, an empty string) is a TypeError that names the request."""
    from paged.step03_attention.policies import EndRequest

    class Answers(EndRequest):
        def __init__(self, answer):
            self.answer = answer

        def choose(self, req, *, alone, kv):
            return self.answer

    for answer in (None, 42, ""):
        h = Harness(step03, num_blocks=2, eviction=Answers(answer))
        h.add(7, max_tokens=10, rid="A")
        with pytest.raises(TypeError, match=f"must answer 'swap', 'recompute' or a finish reason, got {answer!r} "
                                            "for request A"):
            h.run(max_iterations=10)


def test_rule_a_kv_manager_holds_a_whole_number_of_blocks():
    """``num_blocks`` must be an int >= 1: a bool, a float or 0 is refused, saying so."""
    from paged.step03_attention.kv_manager import KVManager

    for bad in (True, 2.0, 0, -1):
        with pytest.raises(ValueError, match=f"num_blocks must be >= 1, got {bad!r}"):
            KVManager(bad, 4)
    assert KVManager(3, 4).num_blocks == 3


class _Recording:
    """A stand-in for the engine's ``SamplingStates`` that records what the scheduler hands it."""

    def __init__(self):
        self.attached, self.collected = [], []

    def attach(self, plan, requests):
        self.attached.append((plan, [r.request_id for r in requests]))
        return {}

    def collect(self, requests, results):
        self.collected.append(([r.request_id for r in requests], dict(results)))


def test_rule_the_sampling_states_see_every_plan_and_its_results():
    """The scheduler is the plan's one author: it hands each plan it decides to the sampling states (with
    the running requests, whose contexts go into the plan) and, on update, the running requests and what
    the workers sampled (prompt logprobs come back there)."""
    rec = _Recording()
    h = Harness(step03, num_blocks=8, sampling=rec)
    h.add(3, max_tokens=2, rid="A")
    h.add(3, max_tokens=2, rid="B")
    first = h.tick()
    assert rec.attached == [(first.plan, ["A", "B"])]
    drawn = {s: r for s, r in h.runner.execute(first.plan).items()}
    assert [ids for ids, _ in rec.collected] == [["A", "B"]] and set(rec.collected[0][1]) == set(drawn)


def test_rule_stats_count_queues_blocks_and_each_filled_slot_once():
    """``stats()`` (what /metrics shows): queue lengths, the pool's blocks, the slots holding a token (a
    block shared by several tables counted once, as full as its fullest table), the empty slots of used
    blocks and of free ones, preemptions by mode and the prompt tokens computed — exact, by hand: 16
    blocks of 4; A (6 tokens, then 1 drawn) and W (waiting: the budget admits one prompt)."""
    h = Harness(step03, num_blocks=16, max_num_batched_tokens=8)
    h.add(6, max_tokens=3, rid="A")
    h.add(5, max_tokens=3, rid="W")
    h.tick()
    assert h.scheduler.stats() == {
        "running": 1, "waiting": 1, "swapped": 0, "preemptions": {"swap": 0, "recompute": 0},
        "blocks_total": 16, "blocks_used": 2, "blocks_free": 14, "token_slots_filled": 6,
        "internal_fragmentation_slots": 2, "free_slots": 56, "prompt_tokens_total": 6}
