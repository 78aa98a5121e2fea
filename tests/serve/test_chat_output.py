"""The reply parsers (``chat_output``, ``reasoning``, ``tool_parsers``, ``tools``) on their own, without a model.

Every parser is incremental, and the server parses an unstreamed reply by
feeding it whole: so the property that matters is that a reply fed in any
pieces gives exactly the fields it gives fed whole (exact string equality, at
every split point and in random pieces, Hypothesis), and that the whole parse
is the split a client expects (the reasoning, the content, each call's name and
arguments).
"""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from paged.serve.chat_output import ChatParser, gather
from paged.serve.reasoning import PARSERS as REASONING
from paged.serve.tool_parsers import HermesParser
from paged.serve.tools import CallListParser, NamedCallParser, ToolPlan

CALL = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'
REPLIES = [
    "plain text, no tags",
    "<think>first I think</think>then I answer",
    "<think>never closed",
    "I think</think>and answer",  # deepseek_r1: reasoning without the opening tag
    "Let me look.\n" + CALL,
    CALL + "\n" + CALL.replace("Paris", "Rome") + "\n",
    '<tool_call>{"oops": 1}</tool_call> not a call',
    "<tool_call>not json</tool_call>",
    "see: <tool_call>not json</tool_call>",  # not a call: the space before it stays
    '<tool_call>{"name": "f", "arguments": {}}',  # max_tokens cut after the JSON, before the close
    "a < b but <tool no tag",
    "<think>a</think>" + CALL,
    "   ",
]


def fields(parser: ChatParser, pieces: list[str]):
    delta = None
    for piece in pieces:
        d = parser.feed(piece)
        delta = d if delta is None else delta + d
    delta = delta + parser.finish() if delta is not None else parser.finish()
    return delta.reasoning, delta.content, [(n, a) for _, n, a in gather(delta)]


def make(reasoning: str | None, tools: bool) -> ChatParser:
    return ChatParser(REASONING[reasoning]() if reasoning else None, HermesParser() if tools else None)


@pytest.mark.parametrize("reasoning", [None, "deepseek_r1", "qwen3"])
@pytest.mark.parametrize("tools", [False, True], ids=["no_tools", "hermes"])
@pytest.mark.parametrize("reply", REPLIES)
def test_any_split_gives_the_whole_parse(reply, reasoning, tools):
    """Exact: the reply fed in two pieces at every split point, and one character at a time, gives the
    same reasoning, content and calls as the whole reply."""
    whole = fields(make(reasoning, tools), [reply])
    for cut in range(len(reply) + 1):
        assert fields(make(reasoning, tools), [reply[:cut], reply[cut:]]) == whole, cut
    assert fields(make(reasoning, tools), list(reply)) == whole


@settings(max_examples=200, deadline=None, derandomize=True)
@given(st.lists(st.sampled_from(["<think>", "</think>", "<tool_call>", "</tool_call>", '{"name": "f", ',
                                 '"arguments": {"x": 1}}', "text", " ", "\n", "<", "</", "think", "{"]),
                max_size=12), st.data())
def test_random_replies_in_random_pieces(tokens, data):
    """Exact, on drawn replies made of tag fragments: random pieces give the whole parse."""
    reply = "".join(tokens)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(reply)), max_size=6)))
    pieces = [reply[a:b] for a, b in zip([0, *cuts], [*cuts, len(reply)])]
    for reasoning in (None, "deepseek_r1", "qwen3"):
        assert fields(make(reasoning, True), pieces) == fields(make(reasoning, True), [reply])


def test_the_whole_parse_is_the_split_a_client_expects():
    parser = make("deepseek_r1", True)
    message = parser.whole("<think>sunny?</think>Checking.\n" + CALL)
    assert (message.reasoning, message.content) == ("sunny?", "Checking.")  # the whitespace before a call dropped
    assert [(n, json.loads(a)) for _, n, a in message.tool_calls] == [("get_weather", {"city": "Paris"})]
    assert parser.finish_reason("stop") == "tool_calls" and parser.finish_reason("length") == "length"
    assert make("qwen3", False).whole("no tags").reasoning is None
    assert make("deepseek_r1", False).whole("no close").content in ("", None)
    bad = make(None, True).whole("see: <tool_call>not json</tool_call>")
    assert bad.content == "see: <tool_call>not json</tool_call>" and bad.tool_calls == []


def test_a_call_to_a_tool_not_allowed_is_text_as_written():
    """``allowed_tools`` in auto mode: a block calling another tool is content, exactly as written (whole or
    one character at a time); an allowed call beside it is still a call."""
    reply = "Checking. " + CALL + " " + CALL.replace("get_weather", "now")
    for pieces in ([reply], list(reply)):
        reasoning, content, calls = fields(ChatParser(None, HermesParser(frozenset({"now"}))), pieces)
        assert content == "Checking. " + CALL
        assert [(n, json.loads(a)) for n, a in calls] == [("now", {"city": "Paris"})]


def test_include_reasoning_false_drops_the_reasoning():
    parser = ChatParser(REASONING["qwen3"](), None, include_reasoning=False)
    message = parser.whole("<think>secret</think>answer")
    assert message.reasoning is None and message.content == "answer"


FORCED = '[{"name": "get_weather", "parameters": {"city": "P\\"x", "n": [1, {"a": 2}]}}, ' \
         '{"name": "now", "parameters": {}}]'


def test_call_list_parser_streams_each_calls_arguments():
    """Exact: the arguments of each forced call are the raw text of its parameters, fed whole or one
    character at a time (as tokens arrive), with the id and name in each call's first piece."""
    for pieces in ([FORCED], list(FORCED)):
        parser = CallListParser()
        out = []
        for piece in pieces:
            out += parser.feed(piece).tool_calls
        out += parser.finish().tool_calls
        firsts = {}
        for p in out:
            if p.id is not None:
                assert p.index not in firsts and p.name is not None
                firsts[p.index] = p.name
        calls = gather(type("D", (), {"tool_calls": out})())
        assert [(n, json.loads(a)) for _, n, a in calls] == [(c["name"], c["parameters"]) for c in json.loads(FORCED)]
        assert firsts == {0: "get_weather", 1: "now"}


def test_named_call_parser_is_one_call_of_the_whole_text():
    parser = NamedCallParser("f")
    pieces = [parser.feed(t) for t in ('{"a"', ": 1}")] + [parser.finish()]
    calls = [c for p in pieces for c in p.tool_calls]
    assert calls[0].id and calls[0].name == "f" and "".join(c.arguments for c in calls) == '{"a": 1}'
    assert ChatParser(None, NamedCallParser("f")).finish_reason("stop") == "stop"  # OpenAI's, for a forced call


def test_forced_schemas():
    functions = {"a": {"type": "object"}, "b": {"type": "object", "properties": {}}}
    required = ToolPlan("required", None, parallel=False).schema(functions)
    assert required["maxItems"] == 1 and required["minItems"] == 1
    assert [c["properties"]["name"] for c in required["items"]["anyOf"]] == [{"const": "a"}, {"const": "b"}]
    assert "maxItems" not in ToolPlan("required", None).schema(functions)
    assert ToolPlan("named", None, name="b").schema(functions) == functions["b"]
    assert ToolPlan("auto", None).schema(functions) is None
    only_b = ToolPlan("required", None, allowed=frozenset({"b"})).schema(functions)  # allowed_tools
    assert only_b["items"]["properties"]["name"] == {"const": "b"}
