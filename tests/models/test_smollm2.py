"""SmolLM2-135M-Instruct (4-bit GGUF) in paged against transformers' own GGUF loading of the same file.

The reference is ``transformers.AutoModelForCausalLM.from_pretrained(dir, gguf_file=...)`` in
float32, and its tokenizer from the same file. Runs when ``make install`` has fetched the file
(``paged.models.default``); skips otherwise, saying how to fetch it. One model of each kind is
loaded for the whole module.
"""

from __future__ import annotations

import pytest
import torch
from tokenizers import Tokenizer

from paged import LLM, SamplingParams
from paged.models import ContiguousAttention, load_model
from paged.models.chat_template import read_chat_template
from paged.serve.chat_template import ChatRenderer
from tests.gguf_files import SMOLLM2, needs_smollm2

pytestmark = needs_smollm2

QUESTIONS = ["write a function to reverse a list", "What is the capital of France?",
             "Explain recursion in one sentence.", "Give me three tips for sleeping well."]
NEW_TOKENS = 32
# float32 on both sides over identical dequantized weights: only the order of float32 sums differs
# (fused q/k/v and gate/up GEMMs, attention kernels), a few ulps per op through 30 layers.
LOGIT_ATOL = 2e-3
# Code, unicode, whitespace runs, special tokens; no run of several digits (see the digits test).
MIXED_TEXT = ("def reverse_list(lst):\n    return lst[::-1]  # O(n) — naïve?\n\n\n\tclass Ünïcode: pass  "
              "\r\n日本語 😀 <|im_start|>user\nhi<|im_end|>   trailing   ")


@pytest.fixture(scope="module")
def paged_llm():
    return LLM(str(SMOLLM2), dtype="float32", device="cpu", num_blocks=256)


@pytest.fixture(scope="module")
def hf():
    """transformers' model and tokenizer, both from the GGUF file."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    kwargs = dict(gguf_file=SMOLLM2.name)
    model = AutoModelForCausalLM.from_pretrained(SMOLLM2.parent, dtype=torch.float32, **kwargs).eval()
    return model, AutoTokenizer.from_pretrained(SMOLLM2.parent, **kwargs)


@pytest.fixture(scope="module")
def prompts(paged_llm):
    renderer = ChatRenderer(paged_llm.tokenizer, paged_llm.model.chat_template, paged_llm.model.special_tokens)
    return [renderer.encode([{"role": "user", "content": q}])[1] for q in QUESTIONS]


def test_weights_equal_transformers_dequantization(paged_llm, hf):
    """Bitwise: every weight paged dequantizes equals transformers' (q/k rows un-permuted the same way)."""
    ours = paged_llm.model.model
    theirs = dict(hf[0].named_parameters())
    for name, p in ours.named_parameters():
        parts = ours.checkpoint_layout()[name]
        for ck_name, row, rows in parts:
            assert torch.equal(p[row : row + rows], theirs[ck_name]), ck_name


@torch.inference_mode()
def test_greedy_tokens_and_logits_equal_transformers(paged_llm, hf, prompts, record_property):
    """Exact tokens: paged's 32 greedy tokens for each of 4 chat prompts are transformers' greedy choices.

    Greedy decoding picks each token as the argmax of the logits given everything before it, so
    one transformers forward pass over prompt + paged's answer gives transformers' greedy token at
    every step (what ``generate(do_sample=False)`` would pick, without 128 decode calls). The
    same pass gives the logits of both systems at every position: toleranced (``LOGIT_ATOL``,
    float32 summation order), and the largest difference is printed and recorded.
    """
    model, ours = hf[0], paged_llm.model.model
    got = paged_llm.generate(prompts, SamplingParams(temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True),
                             use_tqdm=False)
    worst = 0.0
    for ids, out in zip(prompts, got):
        answer = out.outputs[0].token_ids
        assert len(answer) == NEW_TOKENS
        seq = torch.tensor(ids + answer)
        theirs = model(seq[None]).logits[0]  # [len(seq), V]
        assert answer == theirs[len(ids) - 1 : -1].argmax(-1).tolist()
        attention = ContiguousAttention(ours.config.num_layers)
        attention.begin([0], [len(seq)])
        mine = ours.compute_logits(ours(seq, torch.arange(len(seq)), attention))
        worst = max(worst, (mine - theirs).abs().max().item())
    record_property("max_logit_abs_diff", worst)
    print(f"\nSmolLM2 float32, paged vs transformers: largest |logit difference| = {worst:.3g}")
    assert worst <= LOGIT_ATOL


def test_tokenizer_ids_equal_transformers(paged_llm, hf):
    """Exact: ids and decoded text on mixed code / unicode / whitespace text, special tokens included."""
    ours, theirs = paged_llm.tokenizer, hf[1]
    ids = ours.encode(MIXED_TEXT, add_special_tokens=False).ids
    assert ids == theirs.encode(MIXED_TEXT, add_special_tokens=False)
    assert ours.decode(ids, skip_special_tokens=False) == MIXED_TEXT


def test_tokenizer_splits_digits_one_by_one(paged_llm):
    """Exact: ``tokenizer.ggml.pre = smollm`` is llama.cpp's rule that isolates every digit (as SmolLM2's own
    tokenizer does). transformers' GGUF conversion uses GPT-2's rule here, which keeps digit runs together,
    so this text is left out of the comparison above."""
    tok = paged_llm.tokenizer
    assert tok.encode("x = 2024").tokens == ["x", "Ġ=", "Ġ", "2", "0", "2", "4"]


def test_folder_saved_by_transformers_chats_in_the_same_format(paged_llm, hf, tmp_path):
    """Exact: SmolLM2 exported to a folder (``save_pretrained`` writes ``chat_template.jinja``): paged reads
    that template, and both it and the GGUF's own render ids equal to ``apply_chat_template`` (system,
    multi-turn, with and without the generation prompt)."""
    theirs = hf[1]
    theirs.save_pretrained(tmp_path)
    template, specials = read_chat_template(tmp_path)
    assert (tmp_path / "chat_template.jinja").is_file() and template == paged_llm.model.chat_template
    renderer = ChatRenderer(Tokenizer.from_file(str(tmp_path / "tokenizer.json")), template, specials)
    from_gguf = ChatRenderer(paged_llm.tokenizer, paged_llm.model.chat_template, paged_llm.model.special_tokens)
    conversations = [
        [{"role": "user", "content": "write a function to reverse a list"}],
        [{"role": "system", "content": "Answer in French."}, {"role": "user", "content": "Hello!"}],
        [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Hello! How can I help?"},
         {"role": "user", "content": "tell me a joke"}],
    ]
    for msgs in conversations:
        for add in (True, False):
            want = theirs.apply_chat_template(msgs, add_generation_prompt=add, tokenize=True, return_dict=False)
            assert renderer.encode(msgs, add)[1] == list(want), (msgs, add)
            assert from_gguf.encode(msgs, add)[1] == list(want), (msgs, add)
    assert renderer.end_of_turn_ids == [theirs.convert_tokens_to_ids("<|im_end|>")]


def test_cached_load_equals_the_converting_load_bitwise(tmp_path, monkeypatch):
    """Bitwise: in bfloat16 (what ``LLM()`` loads), the load that reads the cache entry
    (``paged/models/gguf_cache.py``) has every parameter of the load that dequantized the file and
    wrote it, the same tokenizer ids and the same chat template."""
    monkeypatch.setenv("PAGED_GGUF_CACHE", str(tmp_path))
    converting = load_model(SMOLLM2, dtype="bfloat16")
    [entry] = tmp_path.glob("*.safetensors")
    cached = load_model(SMOLLM2, dtype="bfloat16")
    want = dict(converting.model.named_parameters())
    for name, p in cached.model.named_parameters():
        assert p.dtype == torch.bfloat16 and torch.equal(p, want[name]), name
    assert cached.tokenizer.encode(MIXED_TEXT).ids == converting.tokenizer.encode(MIXED_TEXT).ids
    assert cached.chat_template == converting.chat_template
    assert entry.stat().st_size > 2 * 134_000_000  # 134.5 M parameters of 2 bytes: the whole model
