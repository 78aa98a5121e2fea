"""``StepPlan``: the one message from the scheduler to the workers (docs/architecture.md).

The scheduler side decides everything (which sequences run, where each new
token's K/V goes, which blocks to copy or move); a worker only executes. The
plan is plain data — lists of ints and the requests' sampling settings — so it
can be built without torch, printed, tested, and (step06) broadcast unchanged
to every tensor-parallel worker.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from paged.sampling.sampling_params import SamplingParams

if TYPE_CHECKING:
    from paged.sampling.logits_processors import SamplingContext


# --8<-- [start:stepplan]
@dataclass
class StepPlan:
    """One iteration of the engine.

    Per scheduled sequence ``s`` (in order), ``query_lens[s]`` new tokens are
    packed into ``input_ids`` / ``positions`` / ``slot_mapping``; the sequence
    attends over ``context_lens[s]`` cached tokens (new ones included) through
    ``block_tables[s]``. Only sequences with ``sample[s]`` draw a token: a
    prompt chunk that is not the prompt's last (step05) does not.

    ``seeds[s]`` seeds the sequence's generator the first time the worker sees
    it; the worker keeps that generator until the sequence id appears in
    ``finished_seq_ids``, so sampling state survives preemption.

    ``contexts`` holds, by sequence id, the history and grammar mask of the
    sequences whose requests use penalties, biases, bans, grammars or prompt
    logprobs (``sampling_state.py``); it is empty for a plain batch.

    The memory operations run before the forward pass, swap-outs first (a device
    block a swap-out frees may receive a swap-in of the same iteration), then
    swap-ins, then copies. Step 03 moves no block: its plans leave them empty.
    ``blocks_to_copy`` are step 04's copy-on-writes ``(src, dst)``; ``fanout``
    its ``(seq that computed the row, child seq, child seed)``: a prompt computed
    once whose first token row is sampled by every sequence of its group.
    ``blocks_to_swap_out`` ``(device, host)`` and ``blocks_to_swap_in``
    ``(host, device)`` are step 05's.
    """

    seq_ids: list[int] = field(default_factory=list)
    input_ids: list[int] = field(default_factory=list)  # [T]
    positions: list[int] = field(default_factory=list)  # [T]
    slot_mapping: list[int] = field(default_factory=list)  # [T]
    query_lens: list[int] = field(default_factory=list)  # [S]
    context_lens: list[int] = field(default_factory=list)  # [S]
    block_tables: list[list[int]] = field(default_factory=list)  # S lists
    sample: list[bool] = field(default_factory=list)  # [S]
    sampling_params: list[SamplingParams] = field(default_factory=list)  # [S]
    seeds: list[int] = field(default_factory=list)  # [S]
    finished_seq_ids: list[int] = field(default_factory=list)
    contexts: dict[int, SamplingContext] = field(default_factory=dict)  # seq id -> its SamplingContext
    blocks_to_swap_out: list[tuple[int, int]] = field(default_factory=list)  # (device, host), step05
    blocks_to_swap_in: list[tuple[int, int]] = field(default_factory=list)  # (host, device), step05
    blocks_to_copy: list[tuple[int, int]] = field(default_factory=list)  # (src, dst), step04
    fanout: list[tuple[int, int, int]] = field(default_factory=list)  # (parent, child, child seed), step04
# --8<-- [end:stepplan]

    @property
    def num_tokens(self) -> int:
        return len(self.input_ids)

    @property
    def is_empty(self) -> bool:
        return not self.seq_ids and not self.has_memory_ops

    @property
    def has_memory_ops(self) -> bool:
        """Block moves or copies to run before the forward pass."""
        return bool(self.blocks_to_swap_out or self.blocks_to_swap_in or self.blocks_to_copy)

    def add(self, seq_id, token_ids, start_pos, slots, context_len, block_table, sample, params, seed):
        """Append one sequence's new tokens (``token_ids`` at positions from ``start_pos``)."""
        self.seq_ids.append(seq_id)
        self.input_ids.extend(token_ids)
        self.positions.extend(range(start_pos, start_pos + len(token_ids)))
        self.slot_mapping.extend(slots)
        self.query_lens.append(len(token_ids))
        self.context_lens.append(context_len)
        self.block_tables.append(list(block_table))
        self.sample.append(sample)
        self.sampling_params.append(params)
        self.seeds.append(seed)
