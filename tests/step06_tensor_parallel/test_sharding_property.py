"""Tensor parallelism as a property: W shards combined as the collectives would equal one model.

Hypothesis draws a LLaMA shape — query heads, KV heads, head dim, MLP width,
vocabulary size (sizes that leave the last rank's vocabulary slice padded
included), tied or separate LM head, biases or none — and a world size W that
divides the heads, KV heads and MLP width. One checkpoint of that shape is
loaded whole, and once per rank through ``load_shard``. The W shards then run
the same packed prompts, then one decode token per prompt, in W threads of
this process: each collective is a meeting point where every rank posts its
tensor and reads all of them (``all_reduce`` adds them in rank order,
``all_gather`` concatenates them), which is what gloo or NCCL compute between
processes. No process, no socket.

Equality: every rank's logits equal the unsharded model's **up to
``LOGITS_FLOAT64``** (float64). A row-parallel layer sums W partial dot
products where the whole model sums one long one: the same terms in another
order, a few ulps apart. (The process-based tests in test_tensor_parallel.py
check the real collectives end to end.)
"""

import threading
from dataclasses import dataclass, field

import torch
from hypothesis import HealthCheck, given, settings, strategies as st

from paged.models import ContiguousAttention, load_model
from paged.step06_tensor_parallel import TPGroup, load_shard
from tests.hf_models import build_hf_model, save_checkpoint
from tests.tolerances import LOGITS_FLOAT64


class Meeting:
    """Where W threads exchange one tensor each at every collective, in program order."""

    def __init__(self, world_size: int):
        self.slots: list = [None] * world_size
        self.barrier = threading.Barrier(world_size, timeout=60)  # a rank that never comes fails the test

    def exchange(self, rank: int, x: torch.Tensor) -> list[torch.Tensor]:
        """Post ``x``, wait for every rank, read all posts, wait again (so no slot is overwritten early)."""
        self.slots[rank] = x.clone()
        self.barrier.wait()
        posts = list(self.slots)
        self.barrier.wait()
        return posts


@dataclass(eq=False)
class ThreadGroup(TPGroup):
    """A ``TPGroup`` whose collectives meet other threads instead of other processes."""

    meeting: Meeting = field(default=None)

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        posts = self.meeting.exchange(self.rank, x)
        total = posts[0]
        for p in posts[1:]:
            total = total + p
        return x.copy_(total)

    def all_gather(self, x: torch.Tensor, dim: int = -1) -> torch.Tensor:
        return torch.cat(self.meeting.exchange(self.rank, x.contiguous()), dim=dim)


def forward_twice(model, prompts: list[list[int]], next_tokens: list[int]) -> torch.Tensor:
    """Logits of every prompt position (one packed pass), then of one more token per prompt."""
    attention = ContiguousAttention(model.config.num_layers)
    rows = []
    with torch.no_grad():
        attention.begin(list(range(len(prompts))), [len(p) for p in prompts])
        ids = torch.tensor([t for p in prompts for t in p])
        positions = torch.cat([torch.arange(len(p)) for p in prompts])
        rows.append(model.compute_logits(model(ids, positions, attention)))
        attention.begin(list(range(len(prompts))), [1] * len(prompts))
        positions = torch.tensor([len(p) for p in prompts])
        rows.append(model.compute_logits(model(torch.tensor(next_tokens), positions, attention)))
    return torch.cat(rows)


def run_ranks(path, world_size: int, prompts, next_tokens) -> list[torch.Tensor]:
    """Every rank's logits, each rank in its own thread."""
    meeting, results, errors = Meeting(world_size), [None] * world_size, []

    def rank_main(rank: int) -> None:
        try:
            group = ThreadGroup(rank, world_size, meeting=meeting)
            shard = load_shard(path, torch.float64, "cpu", group).model
            results[rank] = forward_twice(shard, prompts, next_tokens)
        except BaseException as exc:  # reported below; the barrier's timeout frees the other ranks
            errors.append(exc)
            meeting.barrier.abort()

    threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(world_size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return results


@st.composite
def shapes(draw):
    """(config overrides, world size): W divides heads, KV heads and MLP width; vocab may not."""
    world = draw(st.sampled_from([2, 4]))
    kv_heads = world * draw(st.integers(1, 2))
    heads = kv_heads * draw(st.integers(1, 2))
    overrides = dict(
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=draw(st.sampled_from([4, 8, 12])),
        hidden_size=draw(st.sampled_from([32, 48])),
        intermediate_size=world * draw(st.integers(4, 24)),
        vocab_size=draw(st.integers(40, 200)),
        num_hidden_layers=draw(st.integers(1, 2)),
        tie_word_embeddings=draw(st.booleans()),
        attention_bias=draw(st.booleans()),
        mlp_bias=draw(st.booleans()),
    )
    return overrides, world


# half the profile's examples: each builds and loads a checkpoint W + 1 times
@settings(max_examples=max(10, settings().max_examples // 2),
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_w_shards_combined_equal_the_unsharded_model(tmp_path_factory, data):
    overrides, world = data.draw(shapes(), label="shape and world size")
    vocab = overrides["vocab_size"]
    path = save_checkpoint(build_hf_model("llama", **overrides), tmp_path_factory.mktemp("tp"))
    prompts = data.draw(st.lists(st.lists(st.integers(0, vocab - 1), min_size=1, max_size=9),
                                 min_size=1, max_size=3), label="prompts")
    next_tokens = data.draw(st.lists(st.integers(0, vocab - 1), min_size=len(prompts),
                                     max_size=len(prompts)), label="next tokens")
    whole = forward_twice(load_model(path, dtype=torch.float64).model, prompts, next_tokens)
    for rank, logits in enumerate(run_ranks(path, world, prompts, next_tokens)):
        assert logits.shape == whole.shape, rank
        torch.testing.assert_close(logits, whole, **LOGITS_FLOAT64, msg=lambda m: f"rank {rank}: {m}")


def test_the_thread_group_really_combines_partial_results():
    """The fake collectives are not the identity: a rank alone would see only its own part."""
    meeting, out = Meeting(2), [None, None]

    def rank_main(rank):
        group = ThreadGroup(rank, 2, meeting=meeting)
        x = torch.full((2,), float(rank + 1), dtype=torch.float64)
        out[rank] = (group.all_reduce(x.clone()), group.all_gather(x, dim=0))

    threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for summed, gathered in out:
        assert torch.equal(summed, torch.tensor([3.0, 3.0], dtype=torch.float64))
        assert torch.equal(gathered, torch.tensor([1.0, 1.0, 2.0, 2.0], dtype=torch.float64))
