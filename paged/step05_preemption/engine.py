"""The engine of step05: FCFS scheduling with gang preemption, swap and recompute (paper §4.5).

The scheduling is step03's loop with step05's components (``scheduler.py``:
``Preemption`` eviction, ``SwappingKVManager`` with its host pool,
``ChunkedPrefill`` chunking; ``scheduling_policy="fair"``: ``FairShare`` order
across clients; ``"priority"``: ``PriorityFirst``, each request's own rank). This engine sizes the host pool from
``swap_space`` bytes: the scheduler's KV manager gets that many host block
ids, the runner that many blocks of host memory, which it moves the data in
and out of (swap-out before swap-in, both before the forward pass).

Budgets: ``max_num_seqs`` sequences and ``max_num_batched_tokens`` tokens
(2048 by default) per iteration.

Extends: ``paged.step04_sharing.SharingEngine`` (the scheduler it builds,
``runner_class``, the host pool's size).
"""

from __future__ import annotations

import logging
import time

from paged.step02_block_table import KVCache
from paged.step04_sharing import SharingEngine
from paged.step03_attention.policies import FirstComeFirstServed
from paged.step05_preemption.chunked import ChunkedPrefill
from paged.step05_preemption.fair import FairShare
from paged.step05_preemption.iteration_cost import IterationCost
from paged.step05_preemption.policy import Cost
from paged.step05_preemption.priority import PriorityFirst
from paged.step05_preemption.runner import PreemptingModelRunner
from paged.step05_preemption.scheduler import build_scheduler

logger = logging.getLogger("paged")

DEFAULT_SWAP_SPACE = 256 * 2**20  # bytes of host memory for swapped-out blocks
DEFAULT_MAX_NUM_BATCHED_TOKENS = 2048
# Prompt tokens one sequence computes in an iteration, at most: a request arriving beside a long prompt
# waits about one such chunk (docs/benchmarks.md: 256 took an 8 000-token prompt's neighbour from 15.5 s
# to 0.5 s and cost the long prompt 6 % of its time to first token). 0: only the token budget caps a chunk.
DEFAULT_LONG_PREFILL_TOKEN_THRESHOLD = 256
# Seconds the prompt chunks of an iteration should take at most, predicted from the iterations run
# (iteration_cost.py); 0: chunks are capped in tokens only. Off in the engine, so that its schedule does not
# depend on the machine's speed; python -m paged.serve turns it on (a neighbour then waits about two
# iterations).
DEFAULT_LONG_PREFILL_SECONDS = 0.0
# scheduling_policy -> the order component (who goes first, who is evicted first)
SCHEDULING_POLICIES = {"fcfs": FirstComeFirstServed, "fair": FairShare, "priority": PriorityFirst}


class PreemptingEngine(SharingEngine):
    """``SharingEngine`` with a scheduler that preempts instead of ending requests.

    Args:
        preemption_mode: ``"swap"``, ``"recompute"`` or ``"auto"`` (see ``policy.py``).
        swap_space: bytes of host memory for swapped-out blocks (0 disables swapping).
        long_prefill_token_threshold: the most prompt tokens one sequence computes in an iteration
            (``ChunkedPrefill``; vLLM's name), so that an iteration stays short and a request arriving
            during a long prefill starts within one; default 256; 0: only the token budget caps a chunk.
        long_prefill_seconds: the seconds the prompt chunks of an iteration should take at most; a chunk
            is cut to the tokens that fit, by what the iterations run so far cost (``IterationCost``);
            default 0: no time cap.
        scheduling_policy: who goes first: ``"fcfs"`` (the paper's first-come-first-served), ``"fair"``
            (``FairShare``: the client with the fewest requests running first, FCFS within a client;
            with one client the same plans as ``"fcfs"``) or ``"priority"`` (``PriorityFirst``, vLLM's:
            the smallest ``add_request(priority=...)`` first, FCFS within a priority; with every priority
            equal the same plans as ``"fcfs"``).
        **kwargs (object): as ``SharingEngine``; ``max_num_batched_tokens`` defaults to 2048
            and may be smaller than a prompt (chunked prefill).
    """

    runner_class = PreemptingModelRunner

    def __init__(self, model, *, preemption_mode: str = "auto", swap_space: int = DEFAULT_SWAP_SPACE,
                 long_prefill_token_threshold: int = DEFAULT_LONG_PREFILL_TOKEN_THRESHOLD,
                 long_prefill_seconds: float = DEFAULT_LONG_PREFILL_SECONDS, scheduling_policy: str = "fcfs",
                 **kwargs) -> None:
        if not isinstance(swap_space, (int, float)) or swap_space < 0:
            raise ValueError(f"swap_space must be a number of bytes >= 0, got {swap_space!r}")
        if isinstance(long_prefill_seconds, bool) or not isinstance(long_prefill_seconds, (int, float)) \
                or not long_prefill_seconds >= 0:
            raise ValueError(f"long_prefill_seconds must be a number of seconds >= 0 (0: no time cap), "
                             f"got {long_prefill_seconds!r}")
        if scheduling_policy not in SCHEDULING_POLICIES:
            raise ValueError(f"scheduling_policy must be one of {tuple(SCHEDULING_POLICIES)}, got {scheduling_policy!r}")
        self.long_prefill_seconds, self.scheduling_policy = long_prefill_seconds, scheduling_policy
        self._iteration_started = None
        kwargs.setdefault("max_num_batched_tokens", DEFAULT_MAX_NUM_BATCHED_TOKENS)
        self.preemption_mode, self.swap_space = preemption_mode, swap_space
        self.long_prefill_token_threshold = long_prefill_token_threshold
        super().__init__(model, **kwargs)
        logger.info("swap space: %d host blocks; preemption mode: %s; a long prompt's chunk: %s; order: %s",
                    self.scheduler.kv.host.num_blocks, preemption_mode, self._chunk_rule(), scheduling_policy)
        if long_prefill_seconds:
            self.add_observer(self._time_iteration)

    def _chunk_rule(self) -> str:
        """The start-up line's words for how a long prompt is chunked."""
        cap = self.long_prefill_token_threshold
        words = f"at most {cap} tokens" if cap else "up to the token budget"
        return words + (f", cut to {self.long_prefill_seconds:g} s of work" if self.long_prefill_seconds else "")

    def step(self):
        """step03's iteration; with ``long_prefill_seconds``, timed, so the chunking learns its cost."""
        self._iteration_started = time.perf_counter()
        return super().step()

    @staticmethod
    def _time_iteration(engine, plan, results) -> None:
        """Observer: the iteration's plan and seconds (scheduling, memory moves, forward pass, sampling)."""
        if engine._iteration_started is not None:
            engine.scheduler.chunking.observe(plan, time.perf_counter() - engine._iteration_started)

    def _make_scheduler(self, num_blocks: int, free_order):
        """Step05's scheduler; its host pool holds ``swap_space`` bytes of blocks, and the swap-or-recompute
        rule weighs the model's size against a block's bytes."""
        cfg, params = self.model.config, list(self.model.model.parameters())
        per_block = KVCache.bytes_per_block(cfg.num_layers, self.block_size, self._num_kv_heads(cfg), cfg.head_dim,
                                            params[0].dtype)
        cost = Cost(sum(p.numel() for p in params), per_block, params[0].device.type)
        return build_scheduler(num_blocks, self.block_size, host_blocks=int(self.swap_space) // per_block,
                               preemption_mode=self.preemption_mode, cost=cost, free_order=free_order,
                               enable_prefix_caching=self.enable_prefix_caching,
                               chunking=ChunkedPrefill(self.long_prefill_token_threshold, cost=IterationCost(
                                   self.long_prefill_seconds) if self.long_prefill_seconds else None),
                               order=SCHEDULING_POLICIES[self.scheduling_policy](), **self._scheduler_args())

    def _make_runner(self) -> PreemptingModelRunner:
        return self.runner_class(self.model.model, self.kv_cache, self.backend, self.batch_invariant,
                                 host_blocks=self.scheduler.kv.host.num_blocks)
