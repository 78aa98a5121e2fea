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

The rule is one scheduler hook: ``ReservingEngine._admissible`` says whether a
waiting request may start, and here that means "all its chunks can be placed
now", on top of the paged engine's "its first blocks are free".

Invariants (``tests/test_bench_e2e.py``):

* blocks held by a request's tables <= its reserved blocks, so the physical
  free blocks always cover every reservation's unused part: a reserved
  request never waits for memory and is never preempted;
* the arena holds exactly the chunks of live reserved requests (empty when idle);
* ``memory="paged"`` schedules exactly as ``PreemptingEngine``.

Extends: ``paged.step05_preemption.PreemptingEngine`` (its admission hook).
"""

from __future__ import annotations

from paged.step01_allocator import BlockAllocatorError
from paged.step01_allocator.buddy import BuddyAllocator
from paged.step01_allocator.orca import POLICIES
from paged.step01_allocator.waste import TraceRequest
from paged.step03_attention.errors import RequestError
from paged.step05_preemption import PreemptingEngine

MEMORY_MODES = ("paged", "orca-max", "orca-pow2", "orca-oracle")


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
        self.arena = BuddyAllocator(self.allocator.num_blocks, exact=True)  # offsets in blocks
        self.reservations: dict[str, list[int]] = {}  # request id -> chunk offsets

    @property
    def reserving(self) -> bool:
        return self.memory != "paged"

    # --8<-- [start:reservation]
    def reservation(self, prompt_len: int, params) -> tuple[int, int]:
        """``(chunks, blocks per chunk)`` this mode reserves for a request; ``(0, 0)`` if paged."""
        if not self.reserving:
            return 0, 0
        policy = POLICIES[self.memory.removeprefix("orca-")]
        total = min(prompt_len + params.max_tokens, self.max_model_len)
        slots = policy(TraceRequest(prompt_len, total - prompt_len), self.max_model_len)
        return params.best_of, -(-slots // self.block_size)
    # --8<-- [end:reservation]

    def reserved_blocks(self, request_id: str) -> int:
        """Blocks held in the arena for ``request_id`` (0 if none)."""
        return sum(self.arena.size_of(o) for o in self.reservations.get(request_id, []))

    def check_request(self, prompt_token_ids, params) -> None:
        super().check_request(prompt_token_ids, params)
        chunks, size = self.reservation(len(prompt_token_ids), params)
        if chunks and not _place(BuddyAllocator(self.arena.capacity, exact=True), chunks, size):
            raise RequestError(
                f"{self.memory} reserves {chunks} contiguous chunk(s) of {size} blocks for this request; "
                f"a KV cache of {self.arena.capacity} blocks can never hold them at once: "
                "raise num_blocks or lower max_tokens / max_model_len",
                param="max_tokens", bound=self.arena.capacity,
            )

    def stats(self) -> dict:
        out = super().stats()
        out["memory"] = self.memory
        out["blocks_reserved"] = self.arena.num_allocated
        return out

    # --8<-- [start:admissible]
    def _admissible(self, req, need) -> bool:
        """Paged: its first blocks are free. Orca: also, all its chunks can be placed now — then
        they are, and held until it ends (the scheduler admits it right after this answer)."""
        if not super()._admissible(req, need):
            return False
        if not self.reserving:
            return True
        chunks, size = self.reservation(len(req.prompt_token_ids), req.params)
        offsets = _place(self.arena, chunks, size)
        if offsets is None:
            return False  # FCFS: nobody behind it goes first
        self.reservations[req.request_id] = offsets
        return True
    # --8<-- [end:admissible]

    def _retire(self, req) -> None:
        super()._retire(req)
        for offset in self.reservations.pop(req.request_id, []):
            self.arena.free(offset)


def _place(arena: BuddyAllocator, chunks: int, size: int) -> list[int] | None:
    """Allocate ``chunks`` chunks of ``size`` blocks, all or nothing; their offsets or None."""
    offsets = []
    try:
        for _ in range(chunks):
            offsets.append(arena.allocate(size))
    except BlockAllocatorError:  # no room now, or a chunk larger than any root
        for o in offsets:
            arena.free(o)
        return None
    return offsets
