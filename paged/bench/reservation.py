"""Contiguous reservation inside the engine: the paper's Orca baselines (§6.1), everything else equal.

The paper compares vLLM with Orca, which stores each sequence's KV cache in one
contiguous chunk reserved when the request is admitted and held until it ends.
Its three sizings are step01's reservation policies (``paged.step01_allocator.orca``):

* ``orca-max`` — the engine's ``max_model_len``;
* ``orca-pow2`` — the next power of two of the request's true total length
  (prompt + ``max_tokens``), capped at ``max_model_len``;
* ``orca-oracle`` — exactly prompt + ``max_tokens``. It is the *true* total only
  when the request cannot stop early: the throughput bench sets ``max_tokens``
  to the trace's output length with ``ignore_eos=True``.

Here the reservation lives inside this repository's own engine, so that the
kernels, the runner, the scheduler (FCFS, budgets, chunked prefill) and the
block pool are the same as ``memory="paged"``; only the admission rule
differs. A reservation is a ledger over the block pool: one chunk of
``ceil(slots / B)`` blocks per sequence of the request (``best_of`` of them:
parallel samples and beams each get their own, as Orca has no sharing), placed
by a buddy allocator over the pool's block indices (``BuddyAllocator``, exact
chunks) so that external fragmentation is real. A waiting request is admitted
only when all its chunks can be placed; the chunks are freed when it ends.
The K/V itself is written into the request's blocks by the same paged runner.

The rule is the scheduler's admission component (``Reservation``): the scheduler
asks ``OrcaReservation.reserve(request)`` when a waiting request's first
blocks are free — yes only when all its chunks can be placed, and then they
are — and calls ``release(request)`` when it retires. The chunks live in
step01's ledger, ``ContiguousReservations``, the same Orca model the trace
simulator (``simulate_orca``) runs on.

Invariants (``tests/test_bench_e2e.py``):

* blocks held by a request's tables <= its reserved blocks, so the physical
  free blocks always cover every reservation's unused part: a reserved
  request never waits for memory and is never preempted;
* the arena holds exactly the chunks of live reserved requests (empty when idle);
* ``memory="paged"`` schedules exactly as ``PreemptingEngine``.

Extends: ``paged.step05_preemption.PreemptingEngine`` (its scheduler's reservation policy).
"""

from __future__ import annotations

from paged.step01_allocator.orca import POLICIES, ContiguousReservations
from paged.step01_allocator.waste import TraceRequest
from paged.errors import RequestError
from paged.step03_attention.policies import Reservation
from paged.step05_preemption import PreemptingEngine

MEMORY_MODES = ("paged", "orca-max", "orca-pow2", "orca-oracle")


# --8<-- [start:reservation]
class OrcaReservation(Reservation):
    """Orca's admission: all of a request's contiguous chunks, or it waits (the module docstring).

    Args:
        memory: ``"orca-max"``, ``"orca-pow2"`` or ``"orca-oracle"``.
        num_blocks: the block pool the chunks are carved from (the arena spans its indices).
        block_size: tokens per block (B).
        max_model_len: the model's context (Orca Max reserves it; the others are capped by it).
    """

    def __init__(self, memory: str, num_blocks: int, block_size: int, max_model_len: int) -> None:
        self.policy = POLICIES[memory.removeprefix("orca-")]
        self.block_size, self.max_model_len = block_size, max_model_len
        self.ledger = ContiguousReservations(num_blocks, exact=True)  # offsets in blocks

    def chunks(self, prompt_len: int, params) -> tuple[int, int]:
        """``(chunks, blocks per chunk)`` for a request: one chunk per sequence (``best_of``)."""
        total = min(prompt_len + params.max_tokens, self.max_model_len)
        slots = self.policy(TraceRequest(prompt_len, total - prompt_len), self.max_model_len)
        return params.best_of, -(-slots // self.block_size)

    def reserve(self, req) -> bool:
        return self.ledger.reserve(req.request_id, *self.chunks(len(req.prompt_token_ids), req.params))

    def release(self, req) -> None:
        self.ledger.release(req.request_id)
# --8<-- [end:reservation]


class ReservingEngine(PreemptingEngine):
    """``PreemptingEngine`` with a ``memory=`` setting (see the module docstring).

    Args:
        memory: ``"paged"`` (default: blocks on demand), ``"orca-max"``,
            ``"orca-pow2"`` or ``"orca-oracle"``. The Orca modes turn prefix
            caching off (a contiguous chunk cannot map another request's blocks).
        **kwargs (object): as ``PreemptingEngine``.
    """

    def __init__(self, model, *, memory: str = "paged", **kwargs) -> None:
        if memory not in MEMORY_MODES:
            raise ValueError(f"memory must be one of {MEMORY_MODES}, got {memory!r}")
        if memory != "paged":
            if kwargs.get("enable_prefix_caching"):
                raise ValueError(f"memory={memory!r} reserves contiguous chunks, which cannot share "
                                 "cached prefix blocks: leave enable_prefix_caching off")
            kwargs["enable_prefix_caching"] = False
        self.memory = memory
        super().__init__(model, **kwargs)

    def _make_scheduler(self, num_blocks: int, free_order):
        """Step05's scheduler, its admission component swapped for Orca's reservation in the Orca modes."""
        scheduler = super()._make_scheduler(num_blocks, free_order)
        if self.reserving:
            scheduler.admission = OrcaReservation(self.memory, num_blocks, self.block_size, self.max_model_len)
        return scheduler

    @property
    def reserving(self) -> bool:
        return self.memory != "paged"

    @property
    def arena(self):
        """The Orca modes' buddy arena over the block indices (None when paged)."""
        return self.scheduler.admission.ledger.arena if self.reserving else None

    @property
    def reservations(self) -> dict[str, list[int]]:
        """Request id -> offsets of its chunks (empty when paged)."""
        return self.scheduler.admission.ledger.held if self.reserving else {}

    def reservation(self, prompt_len: int, params) -> tuple[int, int]:
        """``(chunks, blocks per chunk)`` this mode reserves for a request; ``(0, 0)`` if paged."""
        return self.scheduler.admission.chunks(prompt_len, params) if self.reserving else (0, 0)

    def reserved_blocks(self, request_id: str) -> int:
        """Blocks held in the arena for ``request_id`` (0 if none)."""
        return self.scheduler.admission.ledger.reserved(request_id) if self.reserving else 0

    def check_request(self, prompt_token_ids, params, priority: int = 0) -> None:
        super().check_request(prompt_token_ids, params, priority)
        chunks, size = self.reservation(len(prompt_token_ids), params)
        ledger = self.scheduler.admission.ledger if chunks else None
        if chunks and not ledger.could_ever_hold(chunks, size):
            raise RequestError(
                f"{self.memory} reserves {chunks} contiguous chunk(s) of {size} blocks for this request; "
                f"a KV cache of {ledger.arena.capacity} blocks can never hold them at once: "
                "raise num_blocks or lower max_tokens / max_model_len",
                param="max_tokens", bound=ledger.arena.capacity,
            )

    def stats(self) -> dict:
        out = super().stats()
        out["memory"] = self.memory
        out["blocks_reserved"] = self.arena.num_allocated if self.reserving else 0
        return out
