"""vLLM's offline API on ``paged.LLM``: programs written for ``vllm.LLM`` run with the import changed.

Two programs in the shape of vLLM's quickstart and of its chat example (the
same calls, in the same order: a prompt list, ``SamplingParams(temperature=0.8,
top_p=0.95)``, ``LLM(model=...)``, ``llm.generate``; ``llm.chat`` on one
conversation, on a batch with a progress bar, and with a given template) run in
a subprocess with ``from paged import ...``: the only other change is the model,
a local folder (nothing is downloaded here). Then each piece, exactly: prompt
dicts give the tokens of the plain forms, ``Logprob`` objects are the engine's
floats with their rank, ``RequestOutput.metrics`` is ordered in time, vLLM's
``SamplingParams`` keywords change the text as vLLM's do, ``beam_search``
equals beam search through ``generate``, ``chat`` equals ``generate`` on the
rendered conversation, and the tokenizer round-trips.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from paged import BeamSearchParams, LLM, Logprob, SamplingParams, TokensPrompt
from paged.demo import DEFAULT_MODEL_PATH
from paged.errors import RequestError

MODEL = str(DEFAULT_MODEL_PATH)
QUICKSTART = f"""
from paged import LLM, SamplingParams

prompts = ["Hello, my name is", "The capital of France is", "def fibonacci(n):"]
sampling_params = SamplingParams(temperature=0.8, top_p=0.95)
llm = LLM(model={MODEL!r})
outputs = llm.generate(prompts, sampling_params)
for output in outputs:
    prompt = output.prompt
    generated_text = output.outputs[0].text
    print(f"Prompt: {{prompt!r}}, Generated text: {{generated_text!r}}")
"""
CHAT = f"""
from paged import LLM, SamplingParams

llm = LLM(model={MODEL!r})
sampling_params = SamplingParams(max_tokens=16, temperature=0.8, top_p=0.95, top_k=50)
conversation = [
    {{"role": "system", "content": "You are a helpful assistant"}},
    {{"role": "user", "content": "Hello"}},
    {{"role": "assistant", "content": "Hello! How can I assist you today?"}},
    {{"role": "user", "content": "Write an essay about the importance of higher education."}},
]
for output in llm.chat(conversation, sampling_params, use_tqdm=False):
    print(f"Prompt: {{output.prompt!r}}, Generated text: {{output.outputs[0].text!r}}")
outputs = llm.chat([conversation for _ in range(10)], sampling_params, use_tqdm=True)
assert len(outputs) == 10
outputs = llm.chat([conversation] * 2, sampling_params, use_tqdm=False,
                   chat_template="{{% for m in messages %}}{{{{ m['content'] }}}}\\n{{% endfor %}}")
print(len(outputs), "with a given template")
"""


@pytest.fixture(scope="module")
def llm():
    return LLM(MODEL, dtype="float32", device="cpu", block_size=8, num_blocks=128, seed=0)


@pytest.mark.parametrize("program, lines", [(QUICKSTART, 3), (CHAT, 1)], ids=["quickstart", "chat_example"])
def test_vllms_programs_run_with_the_import_changed(program, lines, tmp_path):
    script = tmp_path / "program.py"
    script.write_text(textwrap.dedent(program))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=600,
                          env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin",
                               "PYTHONPATH": str(DEFAULT_MODEL_PATH.parents[2])})
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count("Generated text: ") == lines


def test_prompt_dicts_are_the_plain_forms(llm):
    """Exact: {"prompt_token_ids"} = the id list, {"prompt"} = the string (greedy tokens)."""
    greedy = SamplingParams(temperature=0, max_tokens=6)
    ids = llm.encode("def add(a, b):")
    plain = [o.outputs[0].token_ids for o in llm.generate(["def add(a, b):", ids], greedy, use_tqdm=False)]
    dicts = [o.outputs[0].token_ids for o in llm.generate([{"prompt": "def add(a, b):"}, TokensPrompt(
        prompt_token_ids=ids)], greedy, use_tqdm=False)]
    assert dicts == plain and plain[0] == plain[1]
    [one] = llm.generate({"prompt_token_ids": ids}, greedy, use_tqdm=False)  # one prompt alone
    assert one.outputs[0].token_ids == plain[0]


def test_logprobs_are_logprob_objects_with_their_rank(llm):
    out = llm.generate("x =", SamplingParams(temperature=1.0, seed=4, max_tokens=12, logprobs=3), use_tqdm=False)[0]
    c = out.outputs[0]
    for token, entry in zip(c.token_ids, c.logprobs):
        assert all(isinstance(v, Logprob) and v.logprob == float(v) for v in entry.values())
        ranked = sorted(entry.values(), key=lambda v: -v.logprob)
        assert [v.rank for v in ranked[:3]] == [1, 2, 3]
        if len(entry) == 3:  # the drawn token among the top 3: its place there (exact integers)
            assert entry[token].rank == ranked.index(entry[token]) + 1
        else:  # a fourth entry: the drawn token past the top 3
            assert entry[token].rank > 3
        assert entry[token].decoded_token == llm.tokenizer.decode([token], skip_special_tokens=False)
    assert any(len(entry) == 4 for entry in c.logprobs)  # a drawn token past the top 3, ranked
    assert c.cumulative_logprob == pytest.approx(sum(e[t] for t, e in zip(c.token_ids, c.logprobs)))


def test_request_metrics_are_ordered_in_time(llm):
    [out] = llm.generate(["def f():"], SamplingParams(max_tokens=5, ignore_eos=True), use_tqdm=False)
    m = out.metrics
    assert m.arrival_time <= m.first_scheduled_time <= m.first_token_time <= m.last_token_time <= m.finished_time
    assert m.time_in_queue == m.first_scheduled_time - m.arrival_time


def test_vllms_text_keywords(llm):
    """include_stop_str_in_output, skip_special_tokens, detokenize, truncate_prompt_tokens, allowed_token_ids."""
    base = dict(temperature=0, max_tokens=24, ignore_eos=True)
    cut = llm.generate("def f(x):", SamplingParams(**base), use_tqdm=False)[0].outputs[0].text
    stop = cut[3:5]
    plain = llm.generate("def f(x):", SamplingParams(**base, stop=[stop]), use_tqdm=False)[0].outputs[0]
    kept = llm.generate("def f(x):", SamplingParams(**base, stop=[stop], include_stop_str_in_output=True),
                        use_tqdm=False)[0].outputs[0]
    assert kept.text == plain.text + stop and plain.finish_reason == "stop"
    bos = llm.model.config.bos_token_id
    special = SamplingParams(temperature=0, max_tokens=3, ignore_eos=True, allowed_token_ids=[bos])
    out = llm.generate("x", special, use_tqdm=False)[0].outputs[0]
    assert out.token_ids == [bos] * 3 and out.text == ""
    shown = llm.generate("x", SamplingParams(temperature=0, max_tokens=3, ignore_eos=True, allowed_token_ids=[bos],
                                             skip_special_tokens=False), use_tqdm=False)[0].outputs[0]
    assert shown.text == llm.tokenizer.id_to_token(bos) * 3
    assert llm.generate("x", SamplingParams(max_tokens=3, detokenize=False), use_tqdm=False)[0].outputs[0].text == ""
    ids = llm.encode("a b c d e f g")
    out = llm.generate(ids, SamplingParams(max_tokens=1, truncate_prompt_tokens=3), use_tqdm=False)[0]
    assert out.prompt_token_ids == ids[-3:]
    with pytest.raises(RequestError):
        SamplingParams(spaces_between_special_tokens=False)
    vocab = llm.model.config.vocab_size
    with pytest.raises(RequestError, match=rf"allowed_token_ids must be in \[0, {vocab}\)"):  # before it runs
        llm.engine.check_request([1, 2], SamplingParams(allowed_token_ids=[vocab]))


def test_beam_search_is_generates_beam_search(llm):
    """Exact: the beams' tokens and scores are generate's with use_beam_search, best first."""
    [beams] = llm.beam_search([{"prompt": "def f(x):"}], BeamSearchParams(beam_width=3, max_tokens=6))
    [ref] = llm.generate("def f(x):", SamplingParams(n=3, use_beam_search=True, temperature=0, max_tokens=6),
                         use_tqdm=False)
    prompt = ref.prompt_token_ids
    assert [s.tokens for s in beams.sequences] == [prompt + c.token_ids for c in ref.outputs]
    assert [s.cum_logprob for s in beams.sequences] == [c.cumulative_logprob for c in ref.outputs]
    assert beams.sequences[0].text == "def f(x):" + ref.outputs[0].text


def test_chat_is_generate_on_the_rendered_conversation(llm):
    conversation = [{"role": "user", "content": "Write add(a, b)."}]
    greedy = SamplingParams(temperature=0, max_tokens=8)
    [chat] = llm.chat(conversation, greedy, use_tqdm=False)
    tokenizer = llm.get_tokenizer()
    ids = tokenizer.apply_chat_template(conversation, add_generation_prompt=True)
    [ref] = llm.generate(TokensPrompt(prompt_token_ids=ids), greedy, use_tqdm=False)
    assert chat.prompt_token_ids == ids and chat.outputs[0].token_ids == ref.outputs[0].token_ids
    assert tokenizer.decode(tokenizer.encode("x = 1", add_special_tokens=False)) == "x = 1"
    assert tokenizer.eos_token_id == llm.model.eos_token_ids[0] and len(tokenizer) >= tokenizer.vocab_size
