"""Chat with SmolLM2-135M-Instruct through the official ``openai`` client, against ``python -m paged.serve``.

A real server subprocess on loopback serves the GGUF file (float32, greedy). The answer to the
new user's first request must have the shape of an answer: a Python function that reverses a
list, streamed or not (the same text both ways), and a short question must end at the chat
template's end-of-turn token (finish_reason "stop", not "length"). Skips without the file.
"""

from __future__ import annotations

import openai
import pytest

from tests.gguf_files import SMOLLM2, needs_smollm2
from tests.serve.conftest import Server

pytestmark = needs_smollm2
REQUEST = [{"role": "user", "content": "write a function to reverse a list"}]


@pytest.fixture(scope="module")
def client():
    server = Server(str(SMOLLM2), ["--num-blocks", "128", "--seed", "0"])
    yield openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=300)
    server.stop()


def test_chat_answers_with_a_reverse_list_function_streamed_or_not(client):
    """Shape: the reply contains a ``def`` whose body reverses (``reverse`` / ``[::-1]``); the streamed
    text equals the non-streamed text exactly (same greedy tokens)."""
    kw = dict(model="test-model", messages=REQUEST, max_tokens=48, temperature=0)
    r = client.chat.completions.create(**kw)
    text = r.choices[0].message.content
    assert r.choices[0].message.role == "assistant"
    assert "def " in text and ("reverse" in text or "[::-1]" in text), text
    assert not text.startswith(" "), "a ChatML reply starts right after 'assistant\\n'"
    chunks = list(client.chat.completions.create(stream=True, **kw))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == text
    assert chunks[-1].choices[0].finish_reason == r.choices[0].finish_reason


def test_chat_stops_at_the_end_of_turn_token(client):
    """Exact: a one-word answer ends with finish_reason 'stop' well before max_tokens, and the
    end-of-turn token's text is not in the content."""
    r = client.chat.completions.create(
        model="test-model", max_tokens=64, temperature=0,
        messages=[{"role": "user", "content": "What is the capital of France? Answer with one word."}])
    choice = r.choices[0]
    assert choice.finish_reason == "stop" and r.usage.completion_tokens < 64
    assert "Paris" in choice.message.content and "<|im_end|>" not in choice.message.content
