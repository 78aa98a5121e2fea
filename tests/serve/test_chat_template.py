"""Chat templates: found where transformers finds them, rendered to the ids ``apply_chat_template`` gives.

The reference is transformers itself: a ``PreTrainedTokenizerFast`` over the
same ``tokenizer.json`` with the same template, whose
``apply_chat_template(..., tokenize=True)`` ids must equal ``ChatRenderer``'s
exactly, for a system message, several turns, and with and without the
generation prompt. A model without a template answers chat with a 400 while
``/v1/completions`` keeps working.
"""

from __future__ import annotations

import json
import shutil

import pytest
from fastapi.testclient import TestClient
from tokenizers import Tokenizer

from paged import LLM
from paged.demo import DEFAULT_MODEL_PATH
from paged.models import ModelLoadError
from paged.models.chat_template import read_chat_template
from paged.serve.app import build_app
from paged.serve.chat_template import ChatRenderer

CHATML = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + "
          "'<|im_end|>' + '\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
# loop controls, tojson of non-ASCII text, a namespace and whitespace control, as real templates use them
FANCY = ("{{ bos_token }}{% set ns = namespace(n=0) %}{% for m in messages %}{% if m['role'] == 'skip' %}"
         "{% continue %}{% endif %}{% set ns.n = ns.n + 1 %}\n  {{ ns.n }}. {{ m['role'] | upper }}: "
         "{{ m['content'] | tojson }}\n{% endfor %}{% if add_generation_prompt %}>>> {% endif %}")
CONVERSATIONS = {
    "system": [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Reverse a list."}],
    "multi_turn": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Hello! ☺"},
                   {"role": "user", "content": "write  code\n\tplease"}],
}


@pytest.fixture(scope="module")
def tokenizers_pair():
    """(ours, transformers') over the demo model's tokenizer.json, plus ChatML's two special tokens."""
    from transformers import PreTrainedTokenizerFast

    ours = Tokenizer.from_file(str(DEFAULT_MODEL_PATH / "tokenizer.json"))
    ours.add_special_tokens(["<|im_start|>", "<|im_end|>"])
    ref = PreTrainedTokenizerFast(tokenizer_file=str(DEFAULT_MODEL_PATH / "tokenizer.json"),
                                  bos_token="<|bos|>", eos_token="<|eos|>")
    ref.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    return ours, ref


@pytest.mark.parametrize("add_generation_prompt", [True, False])
@pytest.mark.parametrize("conversation", sorted(CONVERSATIONS))
@pytest.mark.parametrize("template", ["demo", "chatml", "fancy"])
def test_rendered_ids_equal_apply_chat_template(tokenizers_pair, template, conversation, add_generation_prompt):
    """Exact: token ids equal transformers' ``apply_chat_template`` for the same template and messages."""
    source = {"demo": (DEFAULT_MODEL_PATH / "chat_template.jinja").read_text(), "chatml": CHATML, "fancy": FANCY}[template]
    ours, ref = tokenizers_pair
    msgs = CONVERSATIONS[conversation]
    renderer = ChatRenderer(ours, source, {"bos_token": "<|bos|>", "eos_token": "<|eos|>"})
    want = ref.apply_chat_template(msgs, chat_template=source, add_generation_prompt=add_generation_prompt,
                                   tokenize=True, return_dict=False)
    assert renderer.encode(msgs, add_generation_prompt)[1] == list(want)


def test_end_of_turn_token_is_the_special_token_after_an_assistant_turn(tokenizers_pair):
    """Exact: ChatML ends a turn with ``<|im_end|>`` (its id is the stop token); the demo template ends a
    turn with a plain newline, which is no stop token."""
    ours, _ = tokenizers_pair
    assert ChatRenderer(ours, CHATML).end_of_turn_ids == [ours.token_to_id("<|im_end|>")]
    demo = (DEFAULT_MODEL_PATH / "chat_template.jinja").read_text()
    assert ChatRenderer(ours, demo, {"bos_token": "<|bos|>"}).end_of_turn_ids == []


# -- where a folder keeps its template ---------------------------------------------------------------


def _folder(tmp_path, files: dict[str, str | dict]):
    for name, content in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content if isinstance(content, str) else json.dumps(content))
    return tmp_path


@pytest.mark.parametrize("files, want", [
    ({"chat_template.jinja": "A"}, "A"),
    ({"tokenizer_config.json": {"chat_template": "B"}}, "B"),
    ({"tokenizer_config.json": {"chat_template": [{"name": "tool_use", "template": "T"},
                                                  {"name": "default", "template": "D"}]}}, "D"),
    ({"chat_template.json": {"chat_template": "P"}}, "P"),
    ({"additional_chat_templates/default.jinja": "E"}, "E"),
    ({"chat_template.jinja": "A", "tokenizer_config.json": {"chat_template": "B"}}, "A"),  # the file wins
    ({"tokenizer_config.json": {"chat_template": "B"}, "chat_template.json": {"chat_template": "P"}}, "B"),
    ({"tokenizer_config.json": {"bos_token": "<s>"}}, None),
])
def test_read_chat_template_finds_it_where_transformers_does(tmp_path, files, want):
    """Exact: the template transformers' ``from_pretrained`` would pick from these files (None: no template)."""
    assert read_chat_template(_folder(tmp_path, files))[0] == want


def test_read_chat_template_special_tokens_and_ambiguity(tmp_path):
    """Exact: bos/eos strings (plain or AddedToken dicts); several named templates without a default is an error."""
    folder = _folder(tmp_path, {"tokenizer_config.json": {"bos_token": {"content": "<s>"}, "eos_token": "</s>",
                                                          "chat_template": "X"}})
    assert read_chat_template(folder) == ("X", {"bos_token": "<s>", "eos_token": "</s>"})
    ambiguous = _folder(tmp_path / "two", {"additional_chat_templates/a.jinja": "A",
                                           "additional_chat_templates/b.jinja": "B"})
    with pytest.raises(ModelLoadError, match=r"chat templates \['a', 'b'\] but none named 'default'"):
        read_chat_template(ambiguous)


# -- a model without a template ---------------------------------------------------------------------


def test_chat_without_a_template_is_a_400_and_completions_still_work(tmp_path):
    """Exact: status 400, the error names the missing template and ``messages``; a completion still runs."""
    folder = tmp_path / "no_template"
    shutil.copytree(DEFAULT_MODEL_PATH, folder)
    (folder / "chat_template.jinja").unlink()
    llm = LLM(str(folder), dtype="float32", num_blocks=64, block_size=8)
    assert llm.model.chat_template is None
    with TestClient(build_app(llm, "m")) as client:
        r = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]})
        assert r.status_code == 400
        err = r.json()["error"]
        assert err["param"] == "messages" and err["code"] == "chat_template_missing"
        assert "no chat template" in err["message"] and "/v1/completions" in err["message"]
        ok = client.post("/v1/completions", json={"prompt": "def f(", "max_tokens": 3, "temperature": 0})
        assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 3
