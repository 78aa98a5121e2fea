"""The step05 scheduler as a state machine: add, abort and step under a starved pool.

Hypothesis picks an engine (block size, a pool of a few blocks, preemption
mode, host pool, token budget) and then interleaves three rules: add a request
(greedy, seeded, parallel sampling ``n`` = 2-3, beam search width 2-3; prompts
and outputs around the block size), abort a live one, and run one iteration.
After every rule these must hold:

* **ownership** — on the device and on the host, the tables of the live
  sequences are the only owners of blocks: no block leaked, none free and
  mapped, every reference count equal to the table entries mapping it
  (``tests.invariants.check_allocator``);
* **coverage** — a running or swapped sequence's table holds exactly the
  blocks its K/V needs (``ceil(filled / B)``), and never more tokens than the
  sequence has; a waiting one holds none;
* **FCFS** — each queue is in arrival order; a request admitted or swapped in
  this iteration arrived before every one still waiting or swapped; nobody is
  admitted in an iteration that preempted, nor while a group is swapped out.

At the end, with no more arrivals, every request that was not aborted must
finish within a bounded number of iterations, with at most ``max_tokens``
tokens per completion, and every device and host block must be free.
All checks are exact (integers); the model's values do not matter here. The rules and invariants
are those of ``test_scheduler_model_free.py`` (the same machine over the scheduler alone); this
file runs them over a real ``PreemptingEngine``.
"""

import functools

import torch
from hypothesis import HealthCheck, settings, strategies as st
from hypothesis.stateful import initialize

from paged.models.random_llama import load_random_llama
from paged.step02_block_table import KVCache
from paged.step05_preemption import PreemptingEngine, SamplingParams
from tests.step05_preemption.test_scheduler_model_free import MAX_LEN, VOCAB, ModelFreeSchedulerMachine


@functools.cache
def _model():
    """Built once per process (a few milliseconds per iteration)."""
    return load_random_llama(vocab_size=VOCAB, max_position_embeddings=MAX_LEN)


class SchedulerMachine(ModelFreeSchedulerMachine):
    """The model-free machine's rules and invariants, over the engine with a random model."""

    @initialize(block_size=st.sampled_from([2, 4]), num_blocks=st.integers(6, 14),
                mode=st.sampled_from(["swap", "recompute", "auto"]), host_blocks=st.integers(0, 12),
                budget=st.sampled_from([None, 4, 9]))
    def start(self, block_size, num_blocks, mode, host_blocks, budget):
        model = _model()
        cfg = model.config
        per_block = KVCache.bytes_per_block(cfg.num_layers, block_size, cfg.num_kv_heads, cfg.head_dim,
                                            torch.float32)
        self.engine = PreemptingEngine(model, block_size=block_size, num_blocks=num_blocks,
                                       preemption_mode=mode, swap_space=host_blocks * per_block,
                                       max_num_batched_tokens=budget, attention_backend="reference")
        self.params: dict[str, SamplingParams] = {}
        self.aborted: set[str] = set()
        self.finished: dict[str, object] = {}


SchedulerMachine.TestCase.settings = settings(
    max_examples=30, stateful_step_count=25, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
test_scheduler_state_machine = SchedulerMachine.TestCase
