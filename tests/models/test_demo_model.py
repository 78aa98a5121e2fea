"""The bundled demo model: the shipped folder is a real, working checkpoint.

What is proven here, against ``paged/demo/model`` as committed:

- it is a complete Hugging Face folder that ``transformers`` loads (``AutoTokenizer``,
  ``AutoModelForCausalLM``) and whose tokenizer round-trips code exactly;
- ``paged.models.load_model`` loads it, and paged's greedy completions are
  token-identical to ``transformers.generate(do_sample=False)`` in float64 (same math,
  other operation order; float64 keeps every argmax the same);
- the held-out loss the model card records for the test subset is reproduced by
  ``paged.demo.evaluate.heldout_loss`` within ``HELDOUT_LOSS_MARGIN`` (skipped when the
  local standard library yields other tokens than the one the model was trained on:
  the card stores the subset's fingerprint);
- ``def fibonacci(n):`` is completed by code that parses more often than chance: the
  measure of ``paged.demo.evaluate.parse_rate`` (128 seeded samples at temperature 0.8,
  64 new tokens at most, each trimmed to the prompt's top-level block, against 128
  same-length random-token completions) must give a one-sided Fisher p below
  ``PARSE_RATE_P_MAX``. The prompt was fixed before its result was seen, not chosen by it.

The corpus split and the tokenizer are also checked on their own, on the local stdlib.
"""

import ast
import json
import re

import pytest
import torch

from paged.demo import DEFAULT_MODEL_PATH, corpus
from paged.demo.evaluate import heldout_loss, parse_rate, parses, trim_to_block
from paged.demo.tokenizer import BOS, EOS, PAD, load_tokenizer
from paged.demo.train import TEST_SUBSET_WINDOWS
from tests.tolerances import HELDOUT_LOSS_MARGIN, PARSE_RATE_P_MAX

transformers = pytest.importorskip("transformers")

MODEL = DEFAULT_MODEL_PATH

# Code prompts for the greedy comparison: fixed, generic openings of Python code.
GREEDY_PROMPTS = [
    "def add(a, b):",
    "import os\n\n\ndef read_file(path):\n",
    "class Stack:\n    def __init__(self):\n",
    "for i in range(10):\n",
]
GREEDY_NEW_TOKENS = 24


def _card_figure(name: str, folder=MODEL) -> str:
    card = (folder / "README.md").read_text()
    match = re.search(rf"^\| {re.escape(name)} \| (\S+)", card, re.MULTILINE)
    assert match, f"model card has no '{name}' row"
    return match.group(1)


@pytest.fixture(scope="module")
def hf_tokenizer():
    return transformers.AutoTokenizer.from_pretrained(str(MODEL))


def test_demo_model_folder_is_a_small_llama_with_gqa():
    names = {p.name for p in MODEL.iterdir()}
    assert {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
            "tokenizer_config.json", "special_tokens_map.json", "README.md"} <= names
    assert sum(p.stat().st_size for p in MODEL.iterdir()) < 50 * 2**20  # a few tens of MB at most
    config = json.loads((MODEL / "config.json").read_text())
    assert config["model_type"] == "llama"
    assert config["num_key_value_heads"] < config["num_attention_heads"]
    assert config["max_position_embeddings"] >= 1024
    gen = json.loads((MODEL / "generation_config.json").read_text())
    assert gen["eos_token_id"] == load_tokenizer(MODEL).token_to_id(EOS)


def test_demo_model_loads_in_transformers(hf_tokenizer):
    model = transformers.AutoModelForCausalLM.from_pretrained(str(MODEL))
    n_params = sum(p.numel() for p in model.parameters())
    assert 5e6 <= n_params <= 15e6
    assert int(_card_figure("parameters")) == n_params
    assert (hf_tokenizer.bos_token, hf_tokenizer.eos_token, hf_tokenizer.pad_token) == (BOS, EOS, PAD)


def test_demo_tokenizer_round_trips_code_and_agrees_with_transformers(hf_tokenizer):
    source = "def f(x):\n\tif x:\n        return  'é\\n'  # ünïcode\n\n\n  \r\n"
    tok = load_tokenizer(MODEL)
    ids = tok.encode(source).ids
    assert ids[0] == tok.token_to_id(BOS)
    assert hf_tokenizer(source)["input_ids"] == ids
    assert tok.decode(ids, skip_special_tokens=True) == source
    assert hf_tokenizer.decode(ids, skip_special_tokens=True) == source


def test_demo_model_greedy_paged_equals_transformers_float64(hf_tokenizer):
    """Token-identical greedy output, float64 on both sides (docs/architecture.md, levels of equality)."""
    from paged.models import greedy_generate, load_model

    loaded = load_model(MODEL, dtype=torch.float64)
    assert hf_tokenizer.eos_token_id in loaded.eos_token_ids
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(MODEL), dtype=torch.float64).eval()
    prompts = [hf_tokenizer(p)["input_ids"] for p in GREEDY_PROMPTS]
    ours = greedy_generate(loaded.model, prompts, GREEDY_NEW_TOKENS, loaded.eos_token_ids)
    for prompt, got in zip(prompts, ours):
        ids = torch.tensor([prompt])
        want = hf.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                           max_new_tokens=GREEDY_NEW_TOKENS, eos_token_id=hf_tokenizer.eos_token_id,
                           pad_token_id=hf_tokenizer.pad_token_id)[0, len(prompt):].tolist()
        if hf_tokenizer.eos_token_id in want:  # transformers pads after EOS; paged stops
            want = want[: want.index(hf_tokenizer.eos_token_id) + 1]
        assert got == want, hf_tokenizer.decode(prompt)


def test_demo_model_heldout_loss_reproduces_the_card():
    result = heldout_loss(MODEL, max_windows=TEST_SUBSET_WINDOWS)
    if result.fingerprint != _card_figure("test subset fingerprint"):
        pytest.skip("the local standard library tokenizes to other held-out windows than the training "
                    "machine's (another Python version); the card's figure does not apply")
    assert abs(result.loss - float(_card_figure("test subset loss"))) <= HELDOUT_LOSS_MARGIN


def test_demo_model_fibonacci_completion_parses_more_often_than_chance():
    rate = parse_rate(MODEL)
    assert rate.model_parsed > rate.random_parsed, rate
    assert rate.p_value < PARSE_RATE_P_MAX, rate


def test_trim_to_block_stops_at_dedent_and_drops_a_cut_last_line():
    text = "def f(n):\n    return n\n\nprint(f(1))\n"
    assert trim_to_block(text, truncated=False) == "def f(n):\n    return n\n"
    assert trim_to_block("def f(n):\n    x = 1\n    return (n", truncated=True) == "def f(n):\n    x = 1"
    assert not parses(trim_to_block("def f(n):\n    return (n", truncated=True))  # an empty body
    assert parses("def f(n):\n    return n\n") and not parses("def f(n):\n    return (\n")


def test_corpus_split_is_by_file_disjoint_and_deterministic():
    train, held = corpus.list_files("train"), corpus.list_files("heldout")
    assert train and held and not set(train) & set(held)
    assert all(corpus.is_heldout(p) for p in held) and not any(corpus.is_heldout(p) for p in train)
    assert not any(part in corpus.EXCLUDED_DIRS for p in train + held for part in p.split("/")[:-1])
    assert 0.01 < len(held) / (len(train) + len(held)) < 0.15  # about 1 in HELDOUT_MODULUS
    with pytest.raises(ValueError, match="split must be"):
        corpus.list_files("validation")
    for _, text in corpus.documents("heldout"):
        ast.parse(text)  # real Python files, read whole


def test_train_rejects_inconsistent_sizes():
    from paged.demo.train import parse_args

    for bad in (["--heads", "6", "--kv-heads", "4"], ["--seq-len", "2048"], ["--minutes", "0"]):
        with pytest.raises(SystemExit):
            parse_args(["--out", "x", *bad])


@pytest.mark.slow
def test_train_writes_a_folder_that_both_loaders_read(tmp_path):
    """Two steps of a tiny model end to end: folder, card and log are complete and load."""
    from paged.demo.train import main
    from paged.models import load_model

    out = tmp_path / "tiny"
    main(["--out", str(out), "--max-steps", "2", "--minutes", "0", "--vocab-size", "300",
          "--hidden-size", "32", "--layers", "1", "--heads", "4", "--kv-heads", "2",
          "--intermediate-size", "64", "--seq-len", "32", "--batch-size", "2", "--log-every", "1",
          "--max-train-files", "3", "--eval-windows", "4"])
    assert int(_card_figure("training steps", out)) == 2
    assert len((out / "training_log.csv").read_text().splitlines()) == 3  # header + 2 steps
    loaded = load_model(out, dtype=torch.float32)
    assert loaded.config.num_kv_heads == 2 and loaded.eos_token_ids == [1]
    transformers.AutoModelForCausalLM.from_pretrained(str(out))
