"""Same request, same answer, at the defaults: bfloat16, prefix cache on, chunked prefill.

A greedy request's tokens and the log-probabilities of those tokens must be
**bitwise** equal (``==`` on the floats, no tolerance) to its solo run, whatever
happens around it: a prefix-cache hit, 31 other requests in the batch at any
position, a prompt prefilled in chunks, a preemption by swap or by recompute.
The same arithmetic must run for each of its tokens in every case, which is
what batch-invariant mode gives: the attention backend fixes each token's order
over the KV blocks by absolute position (on the CPU the prefill kernel gives a
token the decode kernel's bits, ``tests/kernels/test_cpu_prefill.py``; the other
backends attend one query per row); the GEMMs, norms and the sampler are per row
already (``test_gemm_rows_do_not_depend_on_the_row_count``). A dense linear keeps a row's
bits one of two ways (``layers.gemm``): the stock GEMM with a lone row padded to two, or
the fixed-order kernel (the default on a CPU without a bfloat16 GEMM); every axis runs
under each (``linear_path``), against a solo run under the same one.

Each axis is also run with ``batch_invariant=False`` (prompts through SDPA's
prompt kernel, a cached prefix through the gathered path): the axes that break
then are named in ``BREAKS_WITHOUT``; that test is the proof that the others
can fail.
"""

from __future__ import annotations

import random

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from paged.kernels import cpu
from paged.models import layers as layers_module
from paged.models import load_model
from paged.models.default import DEFAULT_MODEL_PATH
from paged.step05_preemption import PreemptingEngine, SamplingParams
from tests.engine_loop import drain
from tests.gguf_files import SMOLLM2, needs_smollm2

MAX_TOKENS = 12
GREEDY = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True, logprobs=0)


@pytest.fixture(scope="module")
def demo():
    return load_model(DEFAULT_MODEL_PATH, dtype=torch.bfloat16)


def prompt_of(rng: random.Random, vocab: int, n: int) -> list[int]:
    return [1] + [rng.randrange(3, vocab) for _ in range(n - 1)]


def answer(out) -> tuple[list[int], list[float]]:
    """The greedy tokens and each one's log-probability, as the engine returned them."""
    o = out.outputs[0]
    return o.token_ids, [lp[t] for lp, t in zip(o.logprobs, o.token_ids)]


def run(model, target, others=(), position=0, warm=None, **engine_kw):
    """``target``'s answer when run with ``others`` (before it at ``position``) on an engine made
    with ``engine_kw`` (defaults otherwise), after ``warm`` has filled the prefix cache."""
    engine_kw.setdefault("num_blocks", 256)
    engine = PreemptingEngine(model, block_size=16, **engine_kw)
    if warm is not None:
        drain(engine, [("warm", warm, GREEDY)])
    batch = list(others[:position]) + [("target", target, GREEDY)] + list(others[position:])
    done = drain(engine, batch)
    if engine.scheduler.kv.host.num_used:
        raise AssertionError("host blocks leaked")
    return answer(done["target"]), engine


def companions(rng, vocab, n):
    return [(f"o{i}", prompt_of(rng, vocab, rng.randint(5, 60)),
             SamplingParams(temperature=0, max_tokens=rng.randint(4, 20), ignore_eos=True)) for i in range(n)]


def axis_run(model, axis: str, target, rng, **kw):
    """The target's answer under one axis (see the module doc), and the engine."""
    vocab = model.config.vocab_size
    if axis == "cache-hit":  # the prompt's first blocks were written by another request
        return run(model, target, warm=target[:33] + prompt_of(rng, vocab, 9), **kw)
    if axis == "batch-32":
        return run(model, target, companions(rng, vocab, 31), position=17, **kw)
    if axis == "chunked-7":
        return run(model, target, max_num_batched_tokens=7, **kw)
    if axis in ("swap", "recompute"):  # 12 blocks of 16 for 8 requests: preempted again and again
        return run(model, target, companions(rng, vocab, 7), position=3, num_blocks=12,
                   preemption_mode=axis, **kw)
    raise ValueError(axis)


AXES = ["cache-hit", "batch-32", "chunked-7", "swap", "recompute"]
# Measured with batch_invariant=False (bfloat16, the demo model, cpu backend): these two change
# the logprobs within 12 tokens; recompute did too, from the 8th token of a 40-token run.
BREAKS_WITHOUT = ["cache-hit", "chunked-7"]


LINEAR_PATHS = {"padded": "0", "fixed-order": "1"}  # -> PAGED_FIXED_ORDER_LINEAR


@pytest.fixture(scope="module", params=list(LINEAR_PATHS))
def linear_path(request):
    """The dense linears' way to keep a row's bits, forced for the tests that take it: the stock GEMM
    with a lone row padded, or the fixed-order kernel (built, or the test fails)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PAGED_FIXED_ORDER_LINEAR", LINEAR_PATHS[request.param])
        if request.param == "fixed-order":
            cpu.load(strict=True)
        yield request.param


@pytest.fixture(scope="module")
def target(demo):
    return prompt_of(random.Random(7), demo.config.vocab_size, 70)


@pytest.fixture(scope="module")
def solo(demo, target, linear_path):
    return run(demo, target)[0]


def test_the_forced_linear_path_is_the_one_the_engine_takes(demo, target, linear_path):
    _, engine = run(demo, target[:5])
    dense = [m for m in demo.model.modules() if isinstance(m, layers_module.Linear)]
    fixed = linear_path == "fixed-order"
    assert dense and all(m.fixed_order == fixed and m.pad_one_row != fixed for m in dense)
    assert (engine.runner.serving.fixed_order_linears, engine.runner.serving.padded_linears) == (
        (len(dense), 0) if fixed else (0, len(dense)))


@pytest.mark.parametrize("axis", AXES)
def test_greedy_answer_bitwise_equal_to_solo_at_the_defaults(demo, target, solo, axis):
    """Bitwise (tokens and logprob floats ``==``): every token of the request is computed by
    the same operations on the same values in both runs."""
    got, engine = axis_run(demo, axis, target, random.Random(axis))
    if axis in ("swap", "recompute"):
        assert engine.scheduler.preemptions[axis] >= 1, engine.scheduler.preemptions  # it really was preempted
    if axis == "cache-hit":
        assert engine.scheduler.kv.hit_rate() > 0
    assert got == solo


@pytest.mark.parametrize("axis", BREAKS_WITHOUT)
def test_without_batch_invariance_the_axis_changes_the_logprobs(demo, target, axis):
    """The control: with batch-invariant mode off, the same run differs from its own solo run in
    the last bits, so the equality above is a property of the fix, not of the workload."""
    alone = run(demo, target, batch_invariant=False)[0]
    got, _ = axis_run(demo, axis, target, random.Random(axis), batch_invariant=False)
    assert got[1] != alone[1]


@settings(max_examples=6)
@given(data=st.data())
def test_answer_is_bitwise_the_solo_answer_over_random_axes(demo, linear_path, data):
    """Hypothesis over the axes together: prompt length, companions and the target's place among
    them, a token budget that chunks prompts, a pool that forces swap or recompute, a warm prefix
    cache. Bitwise tokens and logprobs, as above."""
    rng = random.Random(data.draw(st.integers(0, 2**16), label="seed"))
    vocab = demo.config.vocab_size
    target = prompt_of(rng, vocab, data.draw(st.integers(1, 80), label="prompt_len"))
    others = companions(rng, vocab, data.draw(st.integers(0, 12), label="companions"))
    kw = {}
    budget = data.draw(st.sampled_from([None, 5, 16, 33]), label="token_budget")
    if budget is not None:
        kw["max_num_batched_tokens"] = budget
    mode = data.draw(st.sampled_from(["none", "swap", "recompute"]), label="preemption")
    if mode != "none":
        kw.update(num_blocks=10, preemption_mode=mode)
    warm = target[: data.draw(st.integers(1, len(target)), label="cached_prefix")] if data.draw(st.booleans()) else None
    got, _ = run(demo, target, others, position=data.draw(st.integers(0, len(others))), warm=warm, **kw)
    assert got == run(demo, target)[0]


def test_gemm_rows_do_not_depend_on_the_row_count(demo):
    """Bitwise: each linear gives a row the same bits in a GEMM of 2, 3, 7, 64 or 300 rows,
    wherever the row sits: the demo model's linears and random ones of SmolLM2's shapes (its
    down projection, K = 1536, is where a one-row GEMM rounded differently on an AVX2 CPU).
    Per-token attention rests on this; a BLAS that picked its kernel by the row count from two
    rows up (float32 MKL does, for small counts) would fail here. One row is never computed
    alone in batch-invariant mode (next test)."""
    gen = torch.Generator().manual_seed(0)
    smollm2_shapes = [torch.nn.Linear(i, o, bias=False).to(torch.bfloat16)
                      for i, o in [(576, 1728), (576, 3072), (1536, 576), (576, 576)]]
    with torch.inference_mode():
        for name, linear in [("qkv", demo.model.model.layers[0].self_attn.qkv_proj),
                             ("down", demo.model.model.layers[0].mlp.down_proj),
                             ("lm_head", demo.model.lm_head)] + [(f"{w.in_features}->{w.out_features}", w)
                                                                  for w in smollm2_shapes]:
            x = (3 * torch.randn(300, linear.in_features, generator=gen)).to(torch.bfloat16)
            full = F.linear(x, linear.weight)
            for lo, hi in [(0, 2), (5, 7), (3, 10), (100, 164), (298, 300)]:
                assert torch.equal(F.linear(x[lo:hi], linear.weight), full[lo:hi]), (name, lo, hi)
            for lo in range(0, 300, 3):
                assert torch.equal(F.linear(x[lo:lo + 3], linear.weight), full[lo:lo + 3]), (name, lo)


def test_a_lone_row_padded_to_two_gets_the_bits_it_gets_among_others(demo, monkeypatch):
    """Bitwise: with ``pad_one_row`` (batch-invariant mode) a linear gives one row alone the bits it gives
    that row among 64 — 256 rows, one at a time, through layers of SmolLM2's shapes and the demo model's
    linears, packed or not. A GEMM of one row takes another kernel, whose float32 sums round to other
    bfloat16 bits now and then: without the padding, 23 of these 256 rows came out otherwise through the
    down projection (K = 1536) on an AMD EPYC Zen 4, as SmolLM2's layer-5 down projection did in a real
    answer (``test_smollm2_answer_bitwise_equal_across_axes``)."""
    from paged.models.layers import Linear, _can_prepack

    monkeypatch.setenv("PAGED_FIXED_ORDER_LINEAR", "0")
    gen = torch.Generator().manual_seed(0)
    demo.model.prepare_for_serving(batch_invariant=True)
    layers = [m for m in demo.model.modules() if isinstance(m, Linear)]
    for i, o in [(1536, 576), (576, 960), (576, 3072)]:
        layer = Linear(i, o, bias=False).to(torch.bfloat16)
        with torch.no_grad():
            layer.weight.copy_((torch.randn(o, i, generator=gen) * 0.05).to(torch.bfloat16))
        layer.pad_one_row = True
        layers.append(layer)
    # packed where this CPU's oneDNN packs bfloat16 weights (AVX-512 or AVX-NE-CONVERT), plain GEMMs elsewhere
    assert all(m.pad_one_row for m in layers)
    assert any(m.packed_weight is not None for m in layers[:-3]) == _can_prepack()
    with torch.inference_mode():
        for layer in layers:
            x = (3 * torch.randn(256, layer.in_features, generator=gen)).to(torch.bfloat16)
            among = torch.cat([layer(x[k:k + 64]) for k in range(0, 256, 64)])
            alone = torch.cat([layer(x[k:k + 1]) for k in range(256)])
            assert torch.equal(alone, among), (layer, int((alone != among).any(dim=1).sum()))


def test_batch_invariant_mode_never_runs_a_one_row_gemm(demo, monkeypatch):
    """A request alone decodes one token per step; in batch-invariant mode every linear multiplies that
    lone row as two (``layers.gemm``), so no GEMM kernel is ever called with one row (and the answer is the
    solo answer, as above); with the mode off, one-row GEMMs run."""
    monkeypatch.setenv("PAGED_FIXED_ORDER_LINEAR", "0")
    seen = []
    product = layers_module.product

    def counting(layer, x, bias=None):
        seen.append(x.shape[0])
        return product(layer, x, bias)

    layers_module.product = counting
    try:
        run(demo, prompt_of(random.Random(1), demo.config.vocab_size, 5))
        on = list(seen)
        seen.clear()
        run(demo, prompt_of(random.Random(1), demo.config.vocab_size, 5), batch_invariant=False)
    finally:
        layers_module.product = product
    assert on and min(on) >= 2, sorted(set(on))[:5]
    assert min(seen) == 1


@pytest.mark.parametrize("has_bf16_gemm", [True, False])
def test_with_fixed_order_linears_a_lone_row_goes_to_the_kernel_as_it_is(demo, monkeypatch, has_bf16_gemm):
    """With the fixed-order kernel no stock GEMM runs in batch-invariant mode, and a lone decode row
    reaches the kernel unpadded (its order does not depend on the row count: tests/kernels/
    test_fixed_order_linear.py). With the mode off the (bfloat16) model keeps the kernel where the CPU has
    no bfloat16 GEMM, the kernel being the faster there, and runs the stock GEMMs again where it has one
    (both CPUs stood in for on any CPU)."""
    monkeypatch.setenv("PAGED_FIXED_ORDER_LINEAR", "1")
    monkeypatch.setattr(layers_module, "cpu_has_bf16_gemm", lambda: has_bf16_gemm)
    stock, fixed = [], []
    product, ext = layers_module.product, cpu.load(strict=True)

    class Counting:  # the kernels, counting the rows of each fixed-order call (an AVX2 build, on any CPU)
        fixed_order_avx2_compiled = staticmethod(lambda: True)
        pair_order_compiled = staticmethod(lambda: False)

        def fixed_order_linear(self, x, w, bias=None, second_thread_bytes=2 << 20):
            fixed.append(x.shape[0])
            return ext.fixed_order_linear(x, w, bias, second_thread_bytes)

    monkeypatch.setattr(layers_module, "product", lambda layer, x, bias=None: stock.append(x.shape[0]) or
                        product(layer, x, bias))
    monkeypatch.setattr(layers_module, "load_cpu_kernels", Counting)
    run(demo, prompt_of(random.Random(1), demo.config.vocab_size, 5))
    assert not stock and min(fixed) == 1 and max(fixed) == 5
    fixed.clear()
    run(demo, prompt_of(random.Random(1), demo.config.vocab_size, 5), batch_invariant=False)
    if has_bf16_gemm:
        assert stock and not fixed
    else:
        assert fixed and not stock


def test_with_the_pair_order_a_lone_row_goes_to_it_as_it_is_in_either_mode(demo, monkeypatch):
    """On a CPU with AVX512_BF16 the bfloat16 model's linears run the pair order
    (``pair_order_linear``) in both modes: no stock GEMM runs, a lone decode row reaches the kernel
    unpadded, and the answer is bitwise the one the mode gives it beside other requests."""
    ext = cpu.load(strict=True)
    if not layers_module.use_pair_order(torch.zeros(1, dtype=torch.bfloat16)):
        pytest.skip("bfloat16 linears do not run the pair order on this CPU (no AVX512_BF16, or AMX)")
    monkeypatch.delenv("PAGED_FIXED_ORDER_LINEAR", raising=False)
    monkeypatch.delenv("PAGED_PREPACK_WEIGHTS", raising=False)
    stock, pairs = [], []
    product = layers_module.product

    class Counting:  # the kernels, counting the rows of each pair-order call
        def __getattr__(self, name):
            return getattr(ext, name)

        def pair_order_linear(self, x, packed, n, bias=None, second_thread_bytes=2 << 20):
            pairs.append(x.shape[0])
            return ext.pair_order_linear(x, packed, n, bias, second_thread_bytes)

    monkeypatch.setattr(layers_module, "product", lambda layer, x, bias=None: stock.append(x.shape[0]) or
                        product(layer, x, bias))
    monkeypatch.setattr(layers_module, "load_cpu_kernels", Counting)
    target = prompt_of(random.Random(1), demo.config.vocab_size, 5)
    alone = run(demo, target)[0]
    assert not stock and min(pairs) == 1 and max(pairs) == 5
    assert run(demo, target, companions(random.Random(9), demo.config.vocab_size, 3), position=1)[0] == alone
    pairs.clear()
    run(demo, target, batch_invariant=False)
    assert not stock and min(pairs) == 1


@pytest.mark.slow
@needs_smollm2
def test_smollm2_answer_bitwise_equal_across_axes(monkeypatch):
    """The chat model of ``make serve`` (SmolLM2, 30 layers, bfloat16): a prompt's answer alone,
    after a prefix-cache hit, beside 7 others while preempted by recompute. Bitwise as above, with
    this CPU's default linear path."""
    monkeypatch.delenv("PAGED_FIXED_ORDER_LINEAR", raising=False)
    model = load_model(str(SMOLLM2), dtype=torch.bfloat16)
    target = prompt_of(random.Random(3), model.config.vocab_size, 60)
    alone = run(model, target)[0]
    assert run(model, target, warm=target[:40])[0] == alone
    rng = random.Random(4)
    got, engine = run(model, target, companions(rng, model.config.vocab_size, 7), position=2,
                      num_blocks=10, preemption_mode="recompute", max_num_batched_tokens=24)
    assert engine.scheduler.preemptions["recompute"] >= 1
    assert got == alone
    # beside 7 others, no preemption, whole prompts: the decode steps of a lone request ran one-row
    # GEMMs whose down projection rounded otherwise, from the 5th token (before the two-copy rule)
    assert run(model, target, companions(random.Random(4), model.config.vocab_size, 7), position=2)[0] == alone
