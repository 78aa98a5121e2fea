"""A sequence: its token ids, its block table and where it stands (paper §4.2, §4.5).

A request's prompt, the tokens generated so far and the block table that maps
its KV cache. Two counts live side by side and differ on purpose:

* ``Sequence.num_tokens`` counts token *ids* (prompt + output);
* ``block_table.num_tokens`` counts tokens whose K/V has a *slot*.

During decoding the newest sampled token has an id but no K/V yet; the next
step appends one slot for it and writes its K/V as it runs the model. So
``block_table.num_tokens <= num_tokens`` always, and the engine keeps them at
most one apart between steps.

The status follows the paper's scheduler (§4.5): a sequence waits, runs, may
be swapped out under memory pressure (step05), and finishes.

Extends: ``BlockTable`` (by composition). Plain Python, no tensors.
"""

from __future__ import annotations

import enum

from paged.step02_block_table.block_table import BlockTable


class SequenceStatus(enum.Enum):
    """Where a sequence is in its life (the scheduler's queues, §4.5)."""

    WAITING = enum.auto()  # admitted, no KV computed yet (or preempted by recompute)
    RUNNING = enum.auto()  # its blocks are on the device, it is in the batch
    SWAPPED = enum.auto()  # its blocks were moved to the CPU pool (step05)
    FINISHED = enum.auto()  # done; ``finish_reason`` says why


def _check_token(token_id: object) -> int:
    if isinstance(token_id, bool) or not isinstance(token_id, int):
        raise TypeError(f"token ids must be ints, got {type(token_id).__name__} {token_id!r}")
    if token_id < 0:
        raise ValueError(f"token ids must be >= 0, got {token_id}")
    return token_id


# --8<-- [start:class]
class Sequence:
    """One sequence of tokens being generated, with its KV block table.

    Args:
        seq_id: unique id of the sequence within the engine.
        prompt_token_ids: the prompt, at least one token.
        block_table: the (usually empty) table its KV slots come from.

    Attributes:
        prompt_token_ids: the prompt (a copy of the list given).
        output_token_ids: tokens generated so far.
        status: a ``SequenceStatus``; starts ``WAITING``.
        finish_reason: ``None`` until finished, then e.g. ``"stop"`` or ``"length"``.
        block_table: its ``BlockTable``.
    """

    def __init__(self, seq_id: int, prompt_token_ids: list[int], block_table: BlockTable) -> None:
        if isinstance(seq_id, bool) or not isinstance(seq_id, int):
            raise TypeError(f"seq_id must be an int, got {seq_id!r}")
        if not isinstance(block_table, BlockTable):
            raise TypeError(f"block_table must be a BlockTable, got {type(block_table).__name__}")
        prompt = [_check_token(t) for t in prompt_token_ids]
        if not prompt:
            raise ValueError("a prompt needs at least one token: there is nothing to continue")
        self.seq_id = seq_id
        self.prompt_token_ids: list[int] = prompt
        self.output_token_ids: list[int] = []
        self.status = SequenceStatus.WAITING
        self.finish_reason: str | None = None
        self.block_table = block_table

    @property
    def token_ids(self) -> list[int]:
        """Prompt followed by output (a new list)."""
        return self.prompt_token_ids + self.output_token_ids

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    def append_token(self, token_id: int) -> None:
        """Record a sampled token. Its K/V slot is appended when it is next fed in."""
        if self.status is SequenceStatus.FINISHED:
            raise ValueError(f"sequence {self.seq_id} is finished ({self.finish_reason})")
        self.output_token_ids.append(_check_token(token_id))

    # --8<-- [end:class]

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_pending(self) -> int:
        """Tokens without K/V yet (``num_tokens - block_table.num_tokens``): the whole prompt of a new
        sequence, the newest token of a decoding one, what is left of a prompt computed in chunks."""
        return self.num_tokens - self.block_table.num_tokens

    @property
    def last_token_id(self) -> int:
        """The newest token id (the input of the next decode step)."""
        return self.output_token_ids[-1] if self.output_token_ids else self.prompt_token_ids[-1]

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

    def finish(self, reason: str) -> None:
        """Mark the sequence finished, with why (``"stop"``, ``"length"``, …).

        The blocks are not freed here: the owner of the allocator does that
        (``block_table.free()``), so it can count them back.
        """
        if not isinstance(reason, str) or not reason:
            raise ValueError(f"a finish reason must be a non-empty str, got {reason!r}")
        self.status = SequenceStatus.FINISHED
        self.finish_reason = reason

    def __repr__(self) -> str:
        return (
            f"Sequence(seq_id={self.seq_id}, prompt={len(self.prompt_token_ids)} tokens, "
            f"output={len(self.output_token_ids)} tokens, status={self.status.name})"
        )
