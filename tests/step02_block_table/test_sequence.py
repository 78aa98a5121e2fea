"""Sequence: token ids, status and its block table (paper §4.2, §4.5). Plain Python."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from paged.step01_allocator import BlockAllocator
from paged.step02_block_table import BlockTable, Sequence, SequenceStatus

token_lists = st.lists(st.integers(0, 50_000), min_size=1, max_size=40)


def new_sequence(prompt, seq_id=0):
    return Sequence(seq_id, prompt, BlockTable(BlockAllocator(8), 4))


@given(prompt=token_lists, output=st.lists(st.integers(0, 50_000), max_size=40))
def test_sequence_token_ids_are_prompt_then_output(prompt, output):
    seq = new_sequence(prompt)
    for t in output:
        seq.append_token(t)
    assert seq.token_ids == prompt + output
    assert seq.num_tokens == len(prompt) + len(output)
    assert seq.prompt_token_ids == prompt and seq.output_token_ids == output
    assert seq.last_token_id == (prompt + output)[-1]
    assert seq.block_table.num_tokens == 0, "appending ids reserves no KV slots"


def test_sequence_starts_waiting_and_owns_a_copy_of_the_prompt():
    prompt = [5, 6, 7]
    seq = new_sequence(prompt)
    prompt.append(8)
    assert seq.prompt_token_ids == [5, 6, 7]
    assert seq.status is SequenceStatus.WAITING and seq.finish_reason is None
    seq.token_ids.append(9)  # token_ids is a new list every time
    assert seq.num_tokens == 3


def test_sequence_status_names_match_the_scheduler_queues():
    assert [s.name for s in SequenceStatus] == ["WAITING", "RUNNING", "SWAPPED", "FINISHED"]


def test_sequence_finish_records_reason_and_blocks_further_tokens():
    seq = new_sequence([1, 2])
    seq.append_token(3)
    seq.finish("length")
    assert seq.is_finished and seq.finish_reason == "length"
    with pytest.raises(ValueError, match="finished"):
        seq.append_token(4)
    assert seq.token_ids == [1, 2, 3]


@pytest.mark.parametrize(
    "prompt, error, match",
    [([], ValueError, "at least one token"), ([1, -2], ValueError, ">= 0"),
     ([1, 2.0], TypeError, "ints"), ([True], TypeError, "ints")],
)
def test_sequence_rejects_bad_prompt(prompt, error, match):
    with pytest.raises(error, match=match):
        new_sequence(prompt)


def test_sequence_rejects_bad_token_and_table():
    seq = new_sequence([1])
    for bad, error in [(-1, ValueError), ("3", TypeError), (None, TypeError)]:
        with pytest.raises(error):
            seq.append_token(bad)
    assert seq.token_ids == [1]
    with pytest.raises(TypeError, match="BlockTable"):
        Sequence(1, [1], [0, 1])
    with pytest.raises(TypeError, match="seq_id"):
        Sequence("a", [1], BlockTable(BlockAllocator(1), 1))
    with pytest.raises(ValueError, match="finish reason"):
        seq.finish("")
    assert seq.status is SequenceStatus.WAITING
