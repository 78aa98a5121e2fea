"""Model equivalence: ``paged.models`` equals Hugging Face ``transformers`` (docs/architecture.md, levels of equality).

For every supported architecture a tiny random checkpoint is written by
``transformers`` (``tests/hf_models.py``), loaded by ``paged.models.load_model``
in float64, and run over ``ContiguousAttention``:

* logits of a batch of prompts of different lengths, packed into one forward
  pass, equal transformers' per-prompt logits — toleranced (``LOGITS_FLOAT64``):
  the math is the same, the operation order is not (fused q/k/v and gate/up
  GEMMs, the softmax scale applied inside attention instead of to q for OPT);
* 20 greedy tokens per prompt are token-identical to ``generate(do_sample=False)``.

The transformers reference runs with ``float64_rmsnorm()``: as shipped its
RMSNorm rounds float64 activations to float32. One test per kind also
compares with transformers as shipped, at the looser float32 tolerance.
Run with ``-s`` to see the largest logit difference per architecture.
"""


import pytest
import torch

from paged.models import ContiguousAttention, greedy_generate, load_model
from tests.hf_models import KINDS, build_hf_model, float64_rmsnorm, save_checkpoint
from tests.oracle import contiguous_attention
from tests.tolerances import FLOAT64, LOGITS_FLOAT64, LOGITS_FLOAT64_VS_HF_FLOAT32_RMSNORM

# Lengths 1 (a lone token), 7 and 40 (past llama3_rope's original context of 32); 40 + 20 new
# tokens stays inside Mistral's window of 64.
PROMPT_LENS = (7, 1, 40)
NEW_TOKENS = 20


def _prompts(vocab: int, seed: int = 1) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(3, vocab, (n,), generator=gen).tolist() for n in PROMPT_LENS]


@pytest.fixture(scope="module", params=KINDS)
def pair(request, tmp_path_factory):
    """(kind, transformers model, our loaded model) for one architecture."""
    hf = build_hf_model(request.param)
    path = save_checkpoint(hf, tmp_path_factory.mktemp(request.param))
    loaded = load_model(path, dtype=torch.float64)
    return request.param, hf, loaded.model


def _ours_packed_logits(model, prompts):
    """One forward pass over all prompts packed: logits of every position, [sum(len), V]."""
    attention = ContiguousAttention(model.config.num_layers)
    attention.begin(list(range(len(prompts))), [len(p) for p in prompts])
    ids = torch.tensor([t for p in prompts for t in p])  # [T]
    positions = torch.cat([torch.arange(len(p)) for p in prompts])  # [T]
    with torch.no_grad():
        return model.compute_logits(model(ids, positions, attention))


def _hf_logits(hf, prompts):
    with torch.no_grad():
        return torch.cat([hf(torch.tensor([p])).logits[0] for p in prompts])  # per prompt, no padding


def test_models_logits_equal_transformers_float64_toleranced(pair):
    """Toleranced (LOGITS_FLOAT64): same math in float64, different operation order."""
    kind, hf, ours = pair
    prompts = _prompts(ours.config.vocab_size)
    got = _ours_packed_logits(ours, prompts)
    with float64_rmsnorm():
        want = _hf_logits(hf, prompts)
    assert got.dtype == torch.float64 and got.shape == want.shape
    print(f"\n[{kind}] largest |logit difference| vs transformers (float64): {(got - want).abs().max().item():.3e}")
    torch.testing.assert_close(got, want, **LOGITS_FLOAT64)


def test_models_logits_close_to_unpatched_transformers(pair):
    """Toleranced (LOGITS_FLOAT64_VS_HF_FLOAT32_RMSNORM): transformers as shipped rounds at its RMSNorms."""
    kind, hf, ours = pair
    prompts = _prompts(ours.config.vocab_size)
    got, want = _ours_packed_logits(ours, prompts), _hf_logits(hf, prompts)
    print(f"\n[{kind}] largest |logit difference| vs transformers as shipped: {(got - want).abs().max().item():.3e}")
    torch.testing.assert_close(got, want, **LOGITS_FLOAT64_VS_HF_FLOAT32_RMSNORM)


def test_models_greedy_tokens_identical_to_transformers_generate(pair):
    """Token-identical: 20 greedy tokens for prompts of lengths 7, 1 and 40 decoded as one batch."""
    kind, hf, ours = pair
    prompts = _prompts(ours.config.vocab_size, seed=2)
    got = greedy_generate(ours, prompts, NEW_TOKENS)
    with float64_rmsnorm(), torch.no_grad():
        want = [
            hf.generate(torch.tensor([p]), max_new_tokens=NEW_TOKENS, do_sample=False)[0, len(p) :].tolist()
            for p in prompts
        ]
    assert [len(g) for g in got] == [NEW_TOKENS] * len(prompts)
    assert got == want


def test_models_chunked_mixed_batch_equals_one_pass_toleranced(pair):
    """Toleranced (FLOAT64): two sequences packed in each forward pass — A's 40-token prompt in chunks of
    5, 1, 13, 21 beside B's 7-token prompt and then single decode-like tokens — give each sequence's
    one-pass logits (different GEMM shapes reorder the sums)."""
    _, _, ours = pair
    a = _prompts(ours.config.vocab_size)[2]  # 40 tokens
    b = _prompts(ours.config.vocab_size, seed=5)[2][:10]
    chunks = {"a": (5, 1, 13, 21), "b": (7, 1, 1, 1)}
    attention, rows, start = ContiguousAttention(ours.config.num_layers), {"a": [], "b": []}, {"a": 0, "b": 0}
    with torch.no_grad():
        for step in range(4):
            lens = [chunks["a"][step], chunks["b"][step]]
            ids, pos = [], []
            for sid, seq, n in (("a", a, lens[0]), ("b", b, lens[1])):
                ids += seq[start[sid] : start[sid] + n]
                pos += range(start[sid], start[sid] + n)
                start[sid] += n
            attention.begin(["a", "b"], lens)
            logits = ours.compute_logits(ours(torch.tensor(ids), torch.tensor(pos), attention))
            rows["a"].append(logits[: lens[0]])
            rows["b"].append(logits[lens[0] :])
    assert attention.context_len("a") == len(a) and attention.context_len("b") == len(b)
    torch.testing.assert_close(torch.cat(rows["a"]), _ours_packed_logits(ours, [a]), **FLOAT64)
    torch.testing.assert_close(torch.cat(rows["b"]), _ours_packed_logits(ours, [b]), **FLOAT64)


def test_models_greedy_stops_at_eos_like_transformers(tmp_path):
    """Token-identical, EOS included: with an EOS id taken from the middle of an unconstrained run, both
    stop right after emitting it."""
    hf = build_hf_model("llama", seed=3)
    ours = load_model(save_checkpoint(hf, tmp_path), dtype=torch.float64).model
    prompt = _prompts(160)[0]
    free_run = greedy_generate(ours, [prompt], NEW_TOKENS)[0]
    eos = free_run[5]
    got = greedy_generate(ours, [prompt, prompt[:3]], NEW_TOKENS, eos_token_ids=[eos])
    with float64_rmsnorm(), torch.no_grad():
        want = hf.generate(torch.tensor([prompt]), max_new_tokens=NEW_TOKENS, do_sample=False, eos_token_id=eos)
    assert got[0] == free_run[: free_run.index(eos) + 1] == want[0, len(prompt) :].tolist()
    assert eos not in got[1][:-1] and (len(got[1]) == NEW_TOKENS or got[1][-1] == eos)


def test_contiguous_attention_equals_oracle_bitwise():
    """Bitwise: ContiguousAttention runs the oracle's arithmetic on the K/V it accumulated, for two
    interleaved GQA sequences fed in chunks (prefill, then a decode step, then a chunk)."""
    gen = torch.Generator().manual_seed(0)
    h, h_kv, d, scale = 4, 2, 8, 8**-0.5
    attention = ContiguousAttention(num_layers=2)
    full = {"a": [[], []], "b": [[], []]}  # seq -> [keys, values] written so far (layer 1)
    for lens in ([5, 3], [1, 1], [0, 4], [2, 1]):
        t = sum(lens)
        q, k, v = (torch.randn(t, n, d, generator=gen, dtype=torch.float64) for n in (h, h_kv, h_kv))
        attention.begin(["a", "b"], lens)
        attention(0, q, k, v, scale)  # layer 0 gets other values, stored separately
        out = attention(1, q, k, v, scale)
        for (sid, qs, ks, vs, os) in zip("ab", q.split(lens), k.split(lens), v.split(lens), out.split(lens)):
            full[sid][0].append(ks)
            full[sid][1].append(vs)
            want = contiguous_attention(qs, torch.cat(full[sid][0]), torch.cat(full[sid][1]), scale)
            assert torch.equal(os, want)
    assert attention.context_len("a") == 8 and attention.context_len("b") == 9
    attention.free("a")
    with pytest.raises(KeyError):
        attention.context_len("a")


def test_contiguous_attention_rejects_bad_batches_unchanged():
    attention = ContiguousAttention(num_layers=1)
    attention.begin([0], [2])
    x = torch.zeros(2, 1, 4)
    attention(0, x, x, x, 1.0)
    for ids, lens in (([1, 2], [1]), ([1, 1], [1, 1]), ([1], [-1])):
        with pytest.raises(ValueError):
            attention.begin(ids, lens)
    assert attention.context_len(0) == 2
    with pytest.raises(ValueError, match="declared 2"):
        attention(0, torch.zeros(3, 1, 4), torch.zeros(3, 1, 4), torch.zeros(3, 1, 4), 1.0)
    assert attention.context_len(0) == 2


def test_greedy_generate_rejects_bad_prompts(pair):
    kind, _, ours = pair
    v = ours.config.vocab_size
    with pytest.raises(ValueError, match="empty"):
        greedy_generate(ours, [[1], []], 2)
    with pytest.raises(ValueError, match="outside"):
        greedy_generate(ours, [[v]], 2)
    with pytest.raises(ValueError, match="max_position_embeddings"):
        greedy_generate(ours, [[3] * ours.config.max_position_embeddings], 1)
    assert greedy_generate(ours, [[3, 4]], 0) == [[]]
