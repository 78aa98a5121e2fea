"""The first engine: iteration-level (Orca-style) FCFS batching over paged KV (paper §4.5).

Every iteration (``step``):

1. the scheduler (``scheduler.py``) decides the ``StepPlan``: running requests
   first, each with slots for its next token (a new block only when its last
   block is full); when no block is free, step03 cannot preempt, so it ends
   the newest running request with ``finish_reason="kv_cache_exhausted"`` and
   frees its blocks; then waiting requests are admitted FCFS while free blocks
   and the budgets cover their prompts;
2. the ``ModelRunner`` runs the plan — prompts and decodes packed into one
   forward pass;
3. the sampled tokens are recorded; a finished sequence leaves the batch and
   frees its blocks at once.

The engine is the three pieces composed: ``self.scheduler`` (a ``Scheduler``:
queues, the KV manager, budgets, every decision, the plan), ``self.runner``
(the only place tensors live) and the outputs it hands back. A later step
builds its own scheduler — step03's loop with that step's components
(``_make_scheduler``) — and its own runner (``runner_class``).

Observing it: ``engine.add_observer(fn)`` calls ``fn(engine, plan, results)``
after every iteration, and ``engine.events`` then holds the iteration's
scheduling decisions as ``EngineEvent(kind, request_id, seq_id, detail)``
records (kinds: admitted, allocated, cow, preempted, swapped_out, swapped_in,
finished, aborted; ``events.py`` gives each kind's ``detail``). The scheduler's
state is read where it lives: ``engine.scheduler.running``,
``engine.scheduler.kv.allocator``, ...
"""

from __future__ import annotations

import logging
import os
import random

from paged.step02_block_table import KVCache
from paged.step03_attention.backends import resolve_backend
from paged.errors import RequestError
from paged.step03_attention.events import EngineEvent
from paged.step03_attention.outputs import RequestOutput
from paged.step03_attention.request import Request, StopChecker
from paged.step03_attention.runner import ModelRunner
from paged.sampling.sampling_params import SamplingParams
from paged.sampling.sampling_state import SamplingStates
from paged.step03_attention.scheduler import Scheduler, build_scheduler

PRIORITY_BOUND = 1 << 63  # a request's priority is a signed 64-bit integer (vLLM's is any int)

logger = logging.getLogger("paged")

DEFAULT_KV_CACHE_MEMORY = 512 * 2**20  # bytes, when neither a budget nor a block count is given
BATCH_INVARIANT_ENV = "VLLM_BATCH_INVARIANT"  # vLLM's spelling of the switch


class Engine:
    """Iteration-level batching engine over a paged KV cache.

    Args:
        model (paged.models.LoadedModel): the model, its config and tokenizer.
        block_size: tokens per KV block (B).
        num_blocks: physical blocks; or derive them from ``kv_cache_memory`` (bytes).
        max_num_seqs: most sequences in one iteration.
        max_num_batched_tokens: most tokens in one iteration (prompts included).
        max_model_len: most tokens per sequence; default: the model's context.
        attention_backend: ``reference|blockwise|cpu|cuda``; default: fastest.
        seed: seeds the generators of requests that give no seed.
        free_order (list[int] | None): initial free-list order of the allocator (tests shuffle it).
        batch_invariant: every token's reduction order fixed by its absolute position, not by the
            batch (the backend's attention kernels, ``AttentionMetadata``; the linears multiply a lone
            row as two, ``CausalLM.prepare_for_serving``), so a request's tokens and logprobs are
            bitwise the same whatever else is in the batch and however its prompt is split; default:
            ``VLLM_BATCH_INVARIANT`` (``1`` / ``0``), else ``_batch_invariant``'s rule.
    """

    runner_class = ModelRunner

    def __init__(
        self,
        model,
        *,
        block_size: int = 16,
        num_blocks: int | None = None,
        kv_cache_memory: int | None = None,
        max_num_seqs: int = 256,
        max_num_batched_tokens: int | None = None,
        max_model_len: int | None = None,
        attention_backend: str | None = None,
        seed: int = 0,
        free_order=None,
        batch_invariant: bool | None = None,
    ) -> None:
        cfg = model.config
        self.model = model
        self.block_size = block_size
        self.max_model_len = max_model_len or cfg.max_model_len
        if not 2 <= self.max_model_len <= cfg.max_model_len:
            raise ValueError(
                f"max_model_len must be in [2, {cfg.max_model_len}] (the model's context), "
                f"got {self.max_model_len}"
            )
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens or max(self.max_model_len, 2048)
        dtype = next(model.model.parameters()).dtype
        device = next(model.model.parameters()).device
        h_kv = self._num_kv_heads(cfg)
        shape = (cfg.num_layers, block_size, h_kv, cfg.head_dim, dtype)
        if num_blocks is None:
            budget = kv_cache_memory or DEFAULT_KV_CACHE_MEMORY
            num_blocks = KVCache.num_blocks_for(budget, *shape)
            how = f"from a budget of {budget / 2**20:.1f} MiB"
        else:
            how = "as given"
        self.stops = StopChecker(model.eos_token_ids, self.max_model_len, model.tokenizer)
        self.sampling = SamplingStates(model.eos_token_ids, model.tokenizer, cfg.vocab_size)
        self.scheduler = self._make_scheduler(num_blocks, free_order)  # refuses a pool of no block
        self.kv_cache = KVCache(
            cfg.num_layers, num_blocks, block_size, h_kv, cfg.head_dim, dtype, device
        )
        self.backend = resolve_backend(device, attention_backend)
        if batch_invariant is None and os.environ.get(BATCH_INVARIANT_ENV, "") in ("0", "1"):
            batch_invariant = os.environ[BATCH_INVARIANT_ENV] == "1"
        self.batch_invariant = self._batch_invariant(batch_invariant)
        self.runner = self._make_runner()
        logger.info(
            "KV cache: %d blocks of %d tokens (%d tokens, %.1f MiB) chosen %s; attention: %s%s%s",
            num_blocks, block_size, num_blocks * block_size,
            self.kv_cache.data.numel() * self.kv_cache.data.element_size() / 2**20, how, self.backend,
            ", batch-invariant" if self.batch_invariant else "",
            " (fixed-order linears)" if self.runner.serving and self.runner.serving.fixed_order_linears else "",
        )
        self._rng = random.Random(seed)
        self.requests: dict[str, Request] = {}
        self.generation_tokens_total = 0  # for /metrics (prompt tokens: the scheduler counts them)
        self.observers: list = []  # called as fn(engine, plan, results) after each iteration
        self.events: list[EngineEvent] = []  # the last iteration's decisions (events.py)

    def _scheduler_args(self) -> dict:
        """What every step's scheduler takes: the budgets, the stopping rules, the sampling states."""
        return {"max_num_seqs": self.max_num_seqs, "max_num_batched_tokens": self.max_num_batched_tokens,
                "stops": self.stops, "sampling": self.sampling}

    def _make_scheduler(self, num_blocks: int, free_order) -> Scheduler:
        """Step03's scheduler (``scheduler.build_scheduler``); a later step builds its own."""
        return build_scheduler(num_blocks, self.block_size, free_order=free_order, **self._scheduler_args())

    def _make_runner(self) -> ModelRunner:
        return self.runner_class(self.model.model, self.kv_cache, self.backend, self.batch_invariant)

    def add_observer(self, fn) -> None:
        """Call ``fn(engine, plan, results)`` after every iteration, between iterations.

        ``plan`` is the ``StepPlan`` the runner executed and ``results`` what it
        sampled (seq id -> ``SampleResult``); ``engine.events`` holds the
        iteration's ``EngineEvent`` records. Observers read; they must not
        change the engine. Benchmarks count plans with it, the server's live
        KV view takes its snapshots from it.
        """
        self.observers.append(fn)

    def remove_observer(self, fn) -> None:
        self.observers.remove(fn)

    def _num_kv_heads(self, cfg) -> int:
        """KV heads this process caches: all of them (step06's driver caches only its shard's)."""
        return cfg.num_kv_heads

    # -- requests -------------------------------------------------------------
    def check_request(self, prompt_token_ids: list[int], params: SamplingParams, priority: int = 0) -> None:
        """Raise ``RequestError`` if the request can never run here; changes nothing."""
        self._check_priority(priority)
        if not prompt_token_ids:
            raise RequestError("the prompt is empty: give at least one token", param="prompt", bound=1)
        vocab = self.model.config.vocab_size
        self.sampling.check(params)
        bad = [t for t in prompt_token_ids if not isinstance(t, int) or not 0 <= t < vocab]
        if bad:
            raise RequestError(f"prompt token ids must be in [0, {vocab}); got {bad[:5]}", param="prompt",
                               bound=(0, vocab))
        n = len(prompt_token_ids)
        if n >= self.max_model_len:
            raise RequestError(
                f"the prompt has {n} tokens; this model allows at most {self.max_model_len - 1} "
                f"(max_model_len {self.max_model_len} minus one generated token)",
                param="prompt", bound=self.max_model_len - 1,
            )
        if n > self.max_num_batched_tokens and not self.scheduler.chunking.splits_prompts:
            raise RequestError(
                f"the prompt has {n} tokens, more than max_num_batched_tokens "
                f"({self.max_num_batched_tokens}) of one iteration",
                param="prompt", bound=self.max_num_batched_tokens,
            )
        need, have = -(-n // self.block_size), self.scheduler.kv.num_blocks
        if need > have:
            raise RequestError(
                f"the prompt needs {need} KV blocks but the cache has only {have}; "
                "raise kv_cache_memory or num_blocks",
                param="prompt", bound=have * self.block_size,
            )
        self._check_group(params)

    def _check_priority(self, priority: int) -> None:
        """``priority`` (vLLM's: the smaller goes first) is an integer of 64 bits, and 0 unless the order
        component ranks by it (``ranks_priority``: step05's ``PriorityFirst``)."""
        if isinstance(priority, bool) or not isinstance(priority, int):
            raise RequestError(f"priority must be an integer, got {type(priority).__name__}", param="priority")
        if not -PRIORITY_BOUND <= priority < PRIORITY_BOUND:
            raise RequestError(f"priority must be in [-2**63, 2**63), got {priority}", param="priority",
                               bound=(-PRIORITY_BOUND, PRIORITY_BOUND))
        if priority and not getattr(self.scheduler.order, "ranks_priority", False):
            raise RequestError(f"priority must be 0 here, got {priority}: this engine's order "
                               f"({type(self.scheduler.order).__name__}) does not rank requests by priority "
                               "(step05's scheduling_policy='priority' does: the server's --scheduling-policy priority)",
                               param="priority", bound=0)

    def _check_group(self, params: SamplingParams) -> None:
        """How many sequences a request may run: one here (step04 adds groups)."""
        if params.n != 1 or params.best_of != 1 or params.use_beam_search:
            field = "use_beam_search" if params.use_beam_search else "best_of" if params.n == 1 else "n"
            raise RequestError("this engine (step03) generates one sequence per request; "
                               "n > 1, best_of and beam search arrive in step04", param=field, bound=1)

    def add_request(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams | None = None,
                    prompt: str | None = None, client: str = "", priority: int = 0) -> None:
        """Queue a request behind the waiting ones (the order component decides who starts first: FCFS
        by default). Invalid requests raise ``RequestError`` and queue nothing. ``client``: who sent it (the
        server: the peer's address), for an order that ranks clients; ``priority``: vLLM's (the smaller
        goes first), for an order that ranks by it, else 0."""
        params = params or SamplingParams()
        if request_id in self.requests:
            raise RequestError(f"request id {request_id!r} is already in use", param="request_id")
        self.check_request(prompt_token_ids, params, priority)
        seed = params.seed if params.seed is not None else self._rng.getrandbits(63)
        self.requests[request_id] = self.scheduler.add(request_id, prompt_token_ids, params, seed, prompt, client,
                                                       priority)

    def _batch_invariant(self, requested: bool | None) -> bool:
        """Whether a token's result must not depend on its batch (the backend then fixes each
        token's reduction order by its position); step03's default is off: prompts may take
        the faster prompt paths (a prompt's tokens then may differ in the last bits from the
        same tokens computed one at a time)."""
        return bool(requested)

    def abort(self, request_id: str) -> bool:
        """Stop a request wherever it is and free its blocks; False if unknown or done."""
        req = self.requests.get(request_id)
        if req is None or req.finished:
            return False
        self.scheduler.abort(req)
        del self.requests[request_id]
        return True

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    # -- what the server's /metrics shows ------------------------------------
    def stats(self) -> dict:
        """The scheduler's queues and counters, the KV pool's blocks and the live Figure 2 breakdown
        of its slots (``Scheduler.stats``), and the tokens generated."""
        return {**self.scheduler.stats(), "generation_tokens_total": self.generation_tokens_total}

    # -- one iteration --------------------------------------------------------
    # --8<-- [start:step]
    def step(self) -> list[RequestOutput]:
        """Run one iteration; returns the requests that advanced or finished in it.

        What one request brings — its grammar, logits processors, sampling, the
        bookkeeping of its tokens — can fail only that request: it ends with
        ``finish_reason="error"`` and its ``RequestOutput.error``, its blocks are
        freed, and the others go on. Only the forward pass itself may raise here.
        """
        plan = self.scheduler.schedule()
        results = self.runner.execute(plan)
        self.generation_tokens_total += len(results)
        touched = self.scheduler.update(plan, results)
        for req in touched:
            if req.finished:
                self.requests.pop(req.request_id, None)
        self.events = self.scheduler.take_events()
        for observe in self.observers:  # between iterations: the state the next one starts from
            observe(self, plan, results)
        return [r.to_output() for r in touched]
    # --8<-- [end:step]
