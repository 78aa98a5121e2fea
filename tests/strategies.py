"""Hypothesis strategies shared by every step's tests (docs/architecture.md).

Sequence lengths always include the edges that break paged code: 0, 1, and
multiples of the block size plus or minus one. Free lists are shuffled so no
test can pass only because physical blocks come out in order.
"""

import json

from hypothesis import strategies as st

BLOCK_SIZES = [1, 2, 4, 8, 16, 32]

block_sizes = st.sampled_from(BLOCK_SIZES)


@st.composite
def seq_lens(draw, block_size: int, max_blocks: int = 6, min_len: int = 0):
    """A length drawn from the edges (0, 1, k*B - 1, k*B, k*B + 1) or anywhere."""
    k = draw(st.integers(1, max_blocks))
    edge = [0, 1, k * block_size - 1, k * block_size, k * block_size + 1]
    n = draw(st.one_of(st.sampled_from(edge), st.integers(0, max_blocks * block_size)))
    return max(n, min_len)


@st.composite
def gqa_heads(draw):
    """(H, H_kv) with H a multiple of H_kv: MHA, GQA and MQA."""
    h_kv = draw(st.sampled_from([1, 2, 4]))
    group = draw(st.sampled_from([1, 2, 4]))
    return h_kv * group, h_kv


head_dims = st.sampled_from([8, 16, 32, 64, 128])


@st.composite
def windows(draw, block_size: int, longest: int):
    """A sliding window W from the edges that break paged code: 1, below the block size, k*B - 1,
    k*B, k*B + 1, longer than every context (``longest`` tokens); or anywhere up to there."""
    k = draw(st.integers(1, 4))
    edges = [1, max(1, block_size - 1), max(1, k * block_size - 1), k * block_size, k * block_size + 1,
             longest + 1, 10**6]
    return draw(st.one_of(st.sampled_from(edges), st.integers(1, longest + 2)))


# Score soft-caps: none; 2, which bends scores of tens; 50, Gemma 2's.
softcaps = st.sampled_from([None, 2.0, 50.0])


@st.composite
def shuffled_free_list(draw, num_blocks: int):
    """A permutation of ``range(num_blocks)``: the allocator's initial free order."""
    return draw(st.permutations(list(range(num_blocks))))


@st.composite
def length_traces(draw, max_prompt: int = 40, max_output: int = 40, max_requests: int = 12):
    """A short list of ``(prompt_len, output_len)`` pairs, both >= 1 (step01 waste)."""
    pairs = st.tuples(st.integers(1, max_prompt), st.integers(1, max_output))
    return draw(st.lists(pairs, min_size=1, max_size=max_requests))

# Head dims of real models beyond the powers of two (Phi-2 80, Qwen-1.8B 96...):
# the C++ kernel specializes each, so its tests draw them too.
model_head_dims = st.sampled_from([64, 80, 96, 128])


# -- hostile HTTP requests (the semantic fuzz of the server, tests/serve/test_semantic_fuzz.py) ----------

EXTREME_INTS = [0, 1, -1, 2, 2**31, 2**53 + 1, 2**63 - 1, 2**63, 2**64, 10**20, -(2**63), -(10**19)]
EXTREME_FLOATS = [0.0, -0.0, 5e-324, 1e-300, 0.5, 1.0 - 1e-16, 1.0 + 1e-15, 2.0000001, 100.0, 1e10,
                  1e300, 1.7976931348623157e308, -1e308]


def _extreme_number():
    return st.sampled_from(EXTREME_INTS) | st.sampled_from(EXTREME_FLOATS) | st.sampled_from([True, None, "1"])


def _regex_bomb():
    atom = st.sampled_from(["a", "(a|aa)", "[a-z]", ".", "(ab|a)", "\\d", "(a*)*", "x?"])
    count = st.sampled_from([0, 1, 10, 100, 256, 999, 1000, 1001, 5000, 10**6, 10**9])
    one = st.builds(lambda a, n: f"{a}{{{n}}}", atom, count)
    nested = st.builds(lambda a, n, m: f"({a}{{{n}}}){{{m}}}", atom, count, count)
    long = st.builds(lambda a, n: a * n, atom, st.sampled_from([1, 100, 1000, 5000]))
    broken = st.sampled_from(["(", "[a-", "a{2,1}", "\\", "(?P<x>a)(?P=x)", "a{99999999999}", "((((((((((a))))))))))"])
    return one | nested | long | broken


def _recursive_schema():
    ref = {"$ref": "#/$defs/a"}
    return st.sampled_from([
        {"$ref": "#/$defs/a", "$defs": {"a": ref}},
        {"$ref": "#/$defs/a", "$defs": {"a": {"allOf": [ref]}}},
        {"$ref": "#/$defs/a", "$defs": {"a": {"anyOf": [ref, {"type": "string"}]}}},
        {"$ref": "#/$defs/a", "$defs": {"a": {"type": "array", "items": ref}}},
        {"$ref": "#/$defs/a", "$defs": {"a": {"type": "object", "properties": {"x": ref, "y": ref},
                                              "required": ["x", "y"]}}},
        {"$ref": "#/$defs/missing"},
        {"type": "object", "properties": {"a": {"$ref": "#"}}, "required": ["a"]},
    ])


def _nested_schema(depth: int) -> dict:
    schema: dict = {"type": "integer"}
    for _ in range(depth):
        schema = {"type": "object", "properties": {"k": schema}, "required": ["k"]}
    return schema


def _huge_schema():
    wide = st.sampled_from([10, 500, 3000]).map(
        lambda n: {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(n)}})
    deep = st.sampled_from([5, 30, 60, 63, 200]).map(_nested_schema)
    enum = st.sampled_from([10, 2000, 20000]).map(lambda n: {"enum": [f"e{i}" for i in range(n)]})
    return wide | deep | enum | st.sampled_from([{"type": "nope"}, {"minimum": "x"}, {"pattern": "("}])


def _huge_list(make):
    return st.sampled_from([0, 1, 63, 64, 65, 1024, 1025, 3000, 20000]).map(lambda n: [make(i) for i in range(n)])


@st.composite
def hostile_requests(draw):
    """``(path, body)``: a small valid request with one to three hostile fields (a JSON body as a dict,
    or raw bytes for what JSON encoders will not write: nesting past any limit, 5 000-digit numbers)."""
    chat = draw(st.booleans())
    body = ({"messages": [{"role": "user", "content": "hi"}]} if chat else {"prompt": "def f(x):"})
    body.update(model="test-model", max_tokens=draw(st.integers(1, 6)), temperature=draw(st.sampled_from([0, 1.0])))
    path = "/v1/chat/completions" if chat else "/v1/completions"
    kinds = draw(st.lists(st.sampled_from(["regex", "choice", "schema", "lists", "numbers", "beam",
                                           "nesting", "digits", "bias_keys"]), min_size=1, max_size=3, unique=True))
    raw_tail = None
    for kind in kinds:
        if kind == "regex":
            body["guided_regex"] = draw(_regex_bomb())
        elif kind == "choice":
            body["guided_choice"] = draw(_huge_list(lambda i: f"c{i}") | st.sampled_from([[""], ["a", "a"], ["x" * 70000]]))
        elif kind == "schema":
            schema = draw(_recursive_schema() | _huge_schema())
            if chat and draw(st.booleans()):
                body["response_format"] = {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}}
            else:
                body["guided_json"] = schema
        elif kind == "lists":
            field = draw(st.sampled_from(["bad_words", "stop", "stop_token_ids", "logit_bias"]))
            if field == "stop_token_ids":
                body[field] = draw(_huge_list(lambda i: i) | st.sampled_from([[2**63], [2**70], [-1], [10**6]]))
            elif field == "logit_bias":
                body[field] = {str(t): 1 for t in draw(_huge_list(lambda i: i))}
            else:
                body[field] = draw(_huge_list(lambda i: f"w{i}") | st.sampled_from([["x" * 5000], ["\u0000"]]))
        elif kind == "numbers":
            for field in draw(st.lists(st.sampled_from(
                    ["seed", "top_k", "top_p", "temperature", "n", "best_of", "max_tokens", "min_tokens",
                     "presence_penalty", "frequency_penalty", "repetition_penalty", "min_p", "length_penalty",
                     "logprobs" if not chat else "top_logprobs"]), min_size=1, max_size=4, unique=True)):
                body[field] = draw(_extreme_number())
        elif kind == "beam":
            body.update(use_beam_search=True, temperature=0, n=draw(st.sampled_from([1, 2, 4])),
                        length_penalty=draw(st.sampled_from([1.0, 10.0, 10.5, 1e308, -1e308, 0.0])),
                        early_stopping=draw(st.sampled_from([True, False, "never"])))
        elif kind == "nesting":
            depth = draw(st.sampled_from([1, 60, 64, 65, 1000, 20000]))
            raw_tail = b', "user": ' + b"[" * depth + b"]" * depth
        elif kind == "digits":
            field = draw(st.sampled_from(["seed", "max_tokens", "top_k", "temperature"]))
            raw_tail = f', "{field}": '.encode() + draw(st.sampled_from([b"9" * 21, b"7" * 5000, b"1e400", b"NaN",
                                                                          b"-Infinity", b"1" + b"0" * 4400]))
        elif kind == "bias_keys":
            body["logit_bias"] = {draw(st.sampled_from(["\u0661\u0662", "１", " 5", "5 ", "-1", "1" * 30, "0x10",
                                                        "²"])): 1}
    if raw_tail is None:
        return path, body
    text = json.dumps(body).encode()
    return path, text[:-1] + raw_tail + b"}"
