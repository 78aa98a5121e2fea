"""The unrolled forward pass (``paged/models/unrolled.py``) against the modules' own, bitwise.

``CausalLM.forward`` takes the unrolled loop once ``prepare_for_serving`` built one; it makes the
modules' kernel calls with the same inputs in the same order, so every test here asks for the
same bits (``torch.equal``), not a tolerance:

* tiny random checkpoints of the LLaMA family (biases, a tied embedding, a sliding window, Qwen3's
  per-head q/k norms, Phi-3's fused projections), of Gemma 2 (soft-capped scores, windows on alternate layers) and
  Gemma 3 (per-head q/k norms, the sliding layers' own RoPE table), and of OPT (pre-LN 125m-style; post-LN
  350m-style with ``project_in`` / ``project_out``), float32 and bfloat16, both
  batch-invariance modes: the hidden states of a packed pass of three prompts and of decode steps
  after it, unrolled and through ``model.model``;
* the default model (SmolLM2-135M, Q4_1 GGUF), dense with batch invariance off and
  ``quantization="gguf"`` with it on (the lanes kernel's call, which the mode off leaves to the
  layer): the engine's greedy tokens and their logprobs over a batch of prompts, with the loop and
  without it;
* where the loop must not run: a forward hook (it runs, through the modules), outside inference
  mode, and a model whose norm's ``forward`` was replaced (the loop would not call it).
"""

from __future__ import annotations

import pytest
import torch

from paged import LLM, SamplingParams
from paged.kernels import cpu
from paged.models import ContiguousAttention, load_model
from paged.models.unrolled import UNROLLED
from tests.hf_models import build_hf_model, save_checkpoint

pytestmark = pytest.mark.skipif(cpu.load() is None or not UNROLLED,
                                reason="the unrolled pass needs the compiled CPU kernels (and PAGED_UNROLLED not 0)")

PROMPT_LENS = (7, 1, 40)
DECODE_STEPS = 3


@pytest.fixture(scope="module", params=["llama", "llama_tied_bias", "mistral", "qwen2", "qwen3", "phi3", "gemma2",
                                        "gemma3", "opt", "opt_350m"])
def checkpoint(request, tmp_path_factory):
    kind = request.param
    hf = build_hf_model(kind, **({"sliding_window": 8} if kind == "mistral" else {})).float()
    return kind, save_checkpoint(hf, tmp_path_factory.mktemp(kind))


def _passes(model, forward, vocab: int) -> list[torch.Tensor]:
    """Hidden states of one packed prefill of PROMPT_LENS, then DECODE_STEPS steps of one token each."""
    gen = torch.Generator().manual_seed(0)
    attention = ContiguousAttention(model.config.num_layers)
    seqs = list(range(len(PROMPT_LENS)))
    ids = torch.randint(3, vocab, (sum(PROMPT_LENS),), generator=gen)
    positions = torch.cat([torch.arange(n) for n in PROMPT_LENS])
    out = []
    with torch.inference_mode():
        attention.begin(seqs, list(PROMPT_LENS))
        out.append(forward(ids, positions, attention).clone())
        lens = list(PROMPT_LENS)
        for _ in range(DECODE_STEPS):
            attention.begin(seqs, [1] * len(seqs))
            ids = torch.randint(3, vocab, (len(seqs),), generator=gen)
            out.append(forward(ids, torch.tensor(lens), attention).clone())
            lens = [n + 1 for n in lens]
    return out


@pytest.mark.parametrize("batch_invariant", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_unrolled_pass_is_the_modules_pass_bitwise(checkpoint, dtype, batch_invariant):
    kind, path = checkpoint
    model = load_model(path, dtype=dtype).model
    model.prepare_for_serving(batch_invariant)
    assert model.unrolled is not None, kind
    vocab = model.config.vocab_size
    got = _passes(model, model, vocab)  # CausalLM.forward: the unrolled loop
    want = _passes(model, model.model, vocab)  # the trunk's modules
    for step, (g, w) in enumerate(zip(got, want)):
        assert g.dtype == dtype and torch.equal(g, w), (kind, step)


@pytest.mark.parametrize(("quantization", "batch_invariant"), [(None, False), ("gguf", True)])
def test_engine_greedy_tokens_and_logprobs_bitwise_with_and_without_the_loop(quantization, batch_invariant):
    llm = LLM(dtype="bfloat16", quantization=quantization, enable_prefix_caching=False,
              batch_invariant=batch_invariant)
    model = llm.model.model
    prompts = [[1] + list(range(100 + 7 * i, 100 + 7 * i + n)) for i, n in enumerate((5, 30, 90, 12))]
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, logprobs=2)

    def run():
        outs = llm.generate(prompts, params, use_tqdm=False)
        return [(list(o.outputs[0].token_ids), [sorted(d.items()) for d in o.outputs[0].logprobs]) for o in outs]

    assert model.unrolled is not None
    if quantization == "gguf":  # mode on: each q|k|v call is the lanes kernel itself where the lanes are laid out
        bound = [hasattr(layer[3], "__self__") for layer in model.unrolled.layers]  # a module's own forward
        assert bound == [not cpu.load().quant_avx2_compiled()] * len(bound)
    unrolled = run()
    loop, model.unrolled = model.unrolled, None
    plain = run()
    model.unrolled = loop
    assert unrolled == plain


def test_a_hook_or_autograd_takes_the_modules_and_a_replaced_norm_is_not_unrolled(tmp_path):
    model = load_model(save_checkpoint(build_hf_model("llama").float(), tmp_path / "llama"), dtype=torch.float32).model
    model.prepare_for_serving()
    assert model.unrolled.applies() is False  # outside inference mode: the modules (autograd, eager formulas)
    with torch.inference_mode():
        assert model.unrolled.applies() is True
        seen = []
        hook = model.model.layers[1].mlp.register_forward_hook(lambda m, args, out: seen.append(out.shape))
        assert model.unrolled.applies() is False
        _passes(model, model, model.config.vocab_size)
        assert len(seen) == 1 + DECODE_STEPS  # the hook ran at every pass: the modules did
        hook.remove()
        assert model.unrolled.applies() is True
    norm = model.model.layers[1].input_layernorm
    norm.forward = norm.eager  # a norm of the learner's own, say: the loop would not call it
    model.prepare_for_serving()
    assert model.unrolled is None
