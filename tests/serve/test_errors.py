"""Bad input: each request below gets its 4xx in OpenAI's error shape, with a message naming the field
and the bound; afterwards the server still serves. The API key is enforced on /v1 (401)."""

from __future__ import annotations

import httpx
import pytest

from tests.serve.conftest import API_KEY, metric

AUTH = {"Authorization": f"Bearer {API_KEY}"}
OK = {"model": "test-model", "prompt": "def f(x):", "max_tokens": 2}
MSG = [{"role": "user", "content": "hi"}]
CHAT = {"model": "test-model", "messages": MSG, "max_tokens": 2}

# (id, path, body: dict merged over the base, or raw bytes, status, param, words in the message)
CASES = [
    ("malformed_json", "/v1/completions", b'{"prompt": ', 400, None, ["malformed JSON", "line 1"]),
    ("empty_body", "/v1/completions", b"", 400, None, ["empty"]),
    ("json_array", "/v1/completions", b"[1, 2]", 400, None, ["JSON object", "list"]),
    ("invalid_utf8", "/v1/completions", b'{"prompt": "\xff\xfe", "max_tokens": 2}', 400, None, ["UTF-8", "0xff"]),
    ("lone_surrogate", "/v1/completions", b'{"prompt": "\\ud800", "max_tokens": 2}', 400, "prompt",
     ["prompt: ", "surrogate"]),
    ("lone_surrogate_in_a_key", "/v1/completions", b'{"prompt": "x", "logit_bias": {"\\udfff": 1}}', 400,
     "logit_bias", ["logit_bias.", "surrogate"]),
    ("nan", "/v1/completions", b'{"prompt": "x", "top_p": NaN}', 400, "top_p", ["top_p: NaN", "not JSON"]),
    ("infinity_in_a_list", "/v1/completions", b'{"prompt": "x", "stop_token_ids": [1, Infinity]}', 400,
     "stop_token_ids", ["stop_token_ids.1: Infinity"]),
    ("number_past_a_double_nested", "/v1/completions", b'{"prompt": "x", "logit_bias": {"7": 1e999}}', 400,
     "logit_bias", ["logit_bias.7: the number 1e999"]),
    ("prompts_over_the_bound", "/v1/completions", {"prompt": [[5, 6]] * 257}, 400, "prompt", ["257", "at most 256"]),
    ("answer_over_the_bound", "/v1/completions", {"prompt": [5] * 800, "n": 64, "echo": True, "logprobs": 20},
     400, "logprobs", ["n 64", "echoed prompt", "at most 262144"]),
    ("missing_prompt", "/v1/completions", {"prompt": None}, 400, "prompt", ["prompt"]),
    ("prompt_wrong_type", "/v1/completions", {"prompt": 123}, 400, "prompt", ["prompt"]),
    ("prompt_empty_list", "/v1/completions", {"prompt": []}, 400, "prompt", ["empty"]),
    ("prompt_empty_token_list", "/v1/completions", {"prompt": [[]]}, 400, "prompt", ["empty"]),
    ("token_id_out_of_vocab", "/v1/completions", {"prompt": [10**9]}, 400, "prompt", ["token ids", "[0,"]),
    ("token_id_negative", "/v1/completions", {"prompt": [-1, 3]}, 400, "prompt", ["token ids"]),
    ("token_id_negative_echoed", "/v1/completions", {"prompt": [-1], "echo": True}, 400, "prompt", ["token ids"]),
    ("token_id_out_of_vocab_echoed", "/v1/completions", {"prompt": [2**40], "echo": True}, 400, "prompt",
     ["token ids"]),
    ("prompt_longer_than_context", "/v1/completions", {"prompt": [5] * 1100}, 400, "prompt",
     ["1100 tokens", "max_model_len"]),
    ("max_tokens_string", "/v1/completions", {"max_tokens": "five"}, 400, "max_tokens", ["integer"]),
    ("max_tokens_bool", "/v1/completions", {"max_tokens": True}, 400, "max_tokens", ["integer"]),
    ("max_tokens_negative", "/v1/completions", {"max_tokens": -3}, 400, "max_tokens", [">= 1", "-3"]),
    ("max_tokens_zero", "/v1/completions", {"max_tokens": 0}, 400, "max_tokens", [">= 1"]),
    ("max_tokens_huge", "/v1/completions", {"max_tokens": 10**12}, 400, "max_tokens", ["max_model_len", "<="]),
    ("temperature_negative", "/v1/completions", {"temperature": -1}, 400, "temperature", ["[0, 100]"]),
    ("temperature_string", "/v1/completions", {"temperature": "hot"}, 400, "temperature", ["number"]),
    ("top_p_zero", "/v1/completions", {"top_p": 0}, 400, "top_p", ["(0, 1]"]),
    ("top_p_above_one", "/v1/completions", {"top_p": 1.5}, 400, "top_p", ["(0, 1]"]),
    ("top_k_negative", "/v1/completions", {"top_k": -5}, 400, "top_k", ["-1"]),
    ("n_zero", "/v1/completions", {"n": 0}, 400, "n", [">= 1"]),
    ("n_over_limit", "/v1/completions", {"n": 1000}, 400, "n", ["64", "1000"]),
    ("best_of_below_n", "/v1/completions", {"n": 3, "best_of": 2}, 400, "best_of", [">= n"]),
    ("best_of_over_limit", "/v1/completions", {"best_of": 100}, 400, "best_of", ["64"]),
    ("logprobs_over_limit", "/v1/completions", {"logprobs": 21}, 400, "logprobs", ["[0, 20]"]),
    ("stop_empty_string", "/v1/completions", {"stop": [""]}, 400, "stop", ["non-empty"]),
    ("stop_wrong_type", "/v1/completions", {"stop": 5}, 400, "stop", ["stop"]),
    ("seed_negative", "/v1/completions", {"seed": -1}, 400, "seed", ["non-negative"]),
    ("known_field_malformed", "/v1/completions", {"max_tokens": "5", "max_token": 5}, 400, "max_tokens",
     ["integer"]),  # an unknown field is accepted (vLLM's rule); a known one is still checked
    ("unknown_model", "/v1/completions", {"model": "gpt-9"}, 404, "model", ["gpt-9", "test-model"]),
    ("stream_with_beam_search", "/v1/completions", {"stream": True, "use_beam_search": True, "temperature": 0},
     400, "stream", ["use_beam_search"]),
    ("beam_search_sampling", "/v1/completions", {"use_beam_search": True, "temperature": 1.0}, 400, "temperature",
     ["temperature=0"]),
    ("presence_penalty_over_2", "/v1/completions", {"presence_penalty": 2.5}, 400, "presence_penalty",
     ["[-2, 2]", "2.5"]),
    ("frequency_penalty_under_minus_2", "/v1/completions", {"frequency_penalty": -3}, 400, "frequency_penalty",
     ["[-2, 2]"]),
    ("repetition_penalty_zero", "/v1/completions", {"repetition_penalty": 0}, 400, "repetition_penalty", ["> 0"]),
    ("min_p_negative", "/v1/completions", {"min_p": -0.1}, 400, "min_p", ["[0, 1]", "-0.1"]),
    ("logit_bias_over_100", "/v1/completions", {"logit_bias": {"5": 101}}, 400, "logit_bias", ["[-100, 100]"]),
    ("logit_bias_under_minus_100", "/v1/completions", {"logit_bias": {"5": -100.5}}, 400, "logit_bias",
     ["[-100, 100]"]),
    ("logit_bias_key_not_a_token_id", "/v1/completions", {"logit_bias": {"abc": 1}}, 400, "logit_bias",
     ["token ids", "abc"]),
    ("logit_bias_outside_vocab", "/v1/completions", {"logit_bias": {"999999": 1}}, 400, "logit_bias",
     ["vocabulary", "4096"]),
    ("bad_words_empty_word", "/v1/completions", {"bad_words": [""]}, 400, "bad_words", ["non-empty"]),
    ("invalid_json_schema", "/v1/completions",
     {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nonsense"}}}},
     400, "response_format", ["Invalid type", "nonsense"]),
    ("json_schema_missing", "/v1/completions", {"response_format": {"type": "json_schema"}}, 400,
     "response_format", ["json_schema"]),
    ("response_format_unknown_type", "/v1/completions", {"response_format": {"type": "yaml"}}, 400,
     "response_format.type", ["yaml"]),
    ("guided_json_not_json", "/v1/completions", {"guided_json": "{nope"}, 400, "guided_json", ["not valid JSON"]),
    ("guided_regex_invalid", "/v1/completions", {"guided_regex": "[a-"}, 400, "guided_regex",
     ["unclosed character class"]),
    ("two_structured_fields", "/v1/completions", {"guided_regex": "a+", "guided_choice": ["a"]}, 400,
     "guided_choice", ["at most one"]),
    ("guided_with_min_tokens", "/v1/completions", {"guided_choice": ["a"], "min_tokens": 1}, 400, "min_tokens",
     ["guided_decoding"]),
    ("stream_options_without_stream", "/v1/completions", {"stream_options": {"include_usage": True}}, 400,
     "stream_options", ["stream: true"]),
    ("chat_empty_messages", "/v1/chat/completions", {"messages": []}, 400, "messages", ["at least 1"]),
    ("chat_missing_role", "/v1/chat/completions", {"messages": [{"content": "hi"}]}, 400, "messages.0.role",
     ["Field required"]),
    ("chat_bad_role", "/v1/chat/completions", {"messages": [{"role": "wizard", "content": "hi"}]}, 400,
     "messages.0.role", ["wizard"]),
    ("chat_image_part", "/v1/chat/completions",
     {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}, 400,
     "messages.0.content.0.type", ["Input should be 'text'", "image_url"]),  # the part, not the string member
    ("chat_content_neither_member", "/v1/chat/completions", {"messages": [{"role": "user", "content": 5}]}, 400,
     "messages.0.content", ["expected a string or a list of", "(got 5)"]),
    ("chat_top_logprobs_without_logprobs", "/v1/chat/completions", {"top_logprobs": 2}, 400, "top_logprobs",
     ["logprobs: true"]),
    ("chat_top_logprobs_over_limit", "/v1/chat/completions", {"logprobs": True, "top_logprobs": 50}, 400,
     "top_logprobs", ["[0, 20]"]),
    ("chat_both_max_tokens", "/v1/chat/completions", {"max_completion_tokens": 2}, 400, "max_completion_tokens",
     ["not both"]),
    ("chat_max_completion_tokens_huge", "/v1/chat/completions", {"max_tokens": None, "max_completion_tokens": 10**6},
     400, "max_completion_tokens", ["max_model_len"]),
    ("chat_unknown_model", "/v1/chat/completions", {"model": "nope"}, 404, "model", ["nope"]),
    ("chat_tool_choice", "/v1/chat/completions", {"tool_choice": "required"}, 400, "tool_choice",
     ["tool_choice", "required", "needs tools"]),
    ("chat_tool_choice_object", "/v1/chat/completions", {"tool_choice": {"type": "function"}}, 400,
     "tool_choice.function", ["tool_choice.function", "Field required"]),
    ("chat_tool_choice_number", "/v1/chat/completions", {"tool_choice": 3}, 400,
     "tool_choice", ["tool_choice", '"required", {"type": "function"', '"allowed_tools"']),
    ("chat_tools", "/v1/chat/completions", {"tools": [{"type": "function"}]}, 400, "tools.0.function", ["tools"]),
    ("chat_tools_auto", "/v1/chat/completions", {"tools": [{"type": "function", "function": {"name": "f"}}]}, 400,
     "tool_choice", ["--enable-auto-tool-choice"]),
    ("chat_answer_over_the_bound", "/v1/chat/completions", {"n": 64, "logprobs": True, "top_logprobs": 20,
                                                            "max_tokens": 900}, 400, "top_logprobs",
     ["top_logprobs 20", "at most 262144"]),
    ("chat_invalid_json_schema", "/v1/chat/completions",
     {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"minItems": "x"}}}},
     400, "response_format", ["minItems"]),
]


def post(server, path, body, headers=AUTH):
    if isinstance(body, bytes):
        return httpx.post(server.url + path, content=body, headers={**headers, "Content-Type": "application/json"},
                          timeout=30)
    base = OK if path == "/v1/completions" else CHAT
    merged = {k: v for k, v in {**base, **body}.items() if v is not None}
    return httpx.post(server.url + path, json=merged, headers=headers, timeout=30)


def assert_error_shape(r, status):
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert isinstance(err["message"], str) and err["message"] and isinstance(err["type"], str)
    return err


def test_table_has_at_least_30_cases():
    assert len(CASES) >= 30


@pytest.mark.parametrize("path,body,status,param,words", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_request_gets_4xx_in_openai_shape(server, path, body, status, param, words):
    err = assert_error_shape(post(server, path, body), status)
    assert err["param"] == param, err
    for w in words:
        assert w in err["message"], (w, err["message"])


def test_body_over_the_size_limit_is_413(server):
    big = {"prompt": "x" * (5 * 2**20)}
    err = assert_error_shape(post(server, "/v1/completions", big), 413)
    assert "bytes" in err["message"]


@pytest.mark.parametrize("method,path,status", [("GET", "/v1/nowhere", 404), ("GET", "/v1/completions", 405)])
def test_unknown_route_and_wrong_method_are_openai_shaped(server, method, path, status):
    assert_error_shape(httpx.request(method, server.url + path, headers=AUTH, timeout=30), status)


def test_server_still_serves_after_every_bad_request(server):
    for _, path, body, *_ in CASES:
        post(server, path, body)
    r = post(server, "/v1/completions", {"max_tokens": 3, "ignore_eos": True})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3
    m = server.metrics()
    assert metric(m, "vllm:num_requests_running") == 0 and metric(m, "vllm:num_requests_waiting") == 0


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong"}, {"Authorization": API_KEY},
                                     {"Authorization": f"Basic {API_KEY}"}],
                         ids=["missing", "wrong", "no_scheme", "basic"])
def test_api_key_is_enforced_on_v1(server, headers):
    for path, body in (("/v1/completions", OK), ("/v1/chat/completions", CHAT)):
        err = assert_error_shape(httpx.post(server.url + path, json=body, headers=headers, timeout=30), 401)
        assert err["code"] == "invalid_api_key" and "Authorization: Bearer" in err["message"]
    assert httpx.get(server.url + "/v1/models", headers=headers, timeout=30).status_code == 401
    assert httpx.get(server.url + "/v1/models", headers=AUTH, timeout=30).status_code == 200
    assert httpx.get(server.url + "/health", timeout=30).status_code == 200  # probes need no key


def test_default_bind_is_loopback():
    from paged.serve.cli import parser

    args = parser().parse_args([])
    assert (args.host, args.port) == ("127.0.0.1", 8000)


def test_engine_refusal_stops_startup_with_its_message(model_path):
    """Options pass to paged.LLM only when set; a value the engine refuses exits at startup with the
    engine's own message, instead of a traceback."""
    from paged.serve.cli import load_llm, parser

    bad = parser().parse_args(["--model", model_path, "--device", "cpu", "--max-model-len", "100000"])
    with pytest.raises(SystemExit) as exc:  # the engine's own ValueError, as a message
        load_llm(bad)
    assert str(exc.value).startswith("error: max_model_len must be in [2, ")
    with pytest.raises(SystemExit):  # argparse refuses non-positive sizes before anything loads
        parser().parse_args(["--block-size", "0"])


@pytest.mark.parametrize("param, rename, expected", [
    ("n", {}, "n"),
    ("prompt", {"prompt": "messages"}, "messages"),
    ("logprobs", {"prompt": "messages", "logprobs": "top_logprobs"}, "top_logprobs"),
])
def test_request_error_maps_to_param_by_its_field_not_its_text(param, rename, expected):
    """``param`` comes from ``RequestError.param`` renamed to the endpoint's field; the message text,
    which here names another field, is not read."""
    from paged import RequestError
    from paged.serve.errors import from_request_error

    err = from_request_error(RequestError("best_of must be <= 64; beam search needs temperature=0", param=param,
                                          bound=64), rename)
    assert (err.status, err.param, err.code) == (400, expected, "invalid_value")
    assert err.message.endswith("best_of must be <= 64; beam search needs temperature=0")
    assert err.message.startswith(f"{expected}: ") == (expected != param)


def test_a_renamed_field_replaces_the_engines_name_at_the_head_of_its_message():
    """A message that starts with the engine's name of the field reads the endpoint's name there
    instead, once (exact), in chat and in the Responses API."""
    from paged import RequestError
    from paged.serve.errors import from_request_error
    from paged.serve.responses import in_responses_terms

    err = from_request_error(RequestError("max_tokens must be an integer >= 1, got 0", param="max_tokens"),
                             {"max_tokens": "max_completion_tokens"})
    assert (err.param, err.message) == ("max_completion_tokens", "max_completion_tokens must be an integer >= 1, got 0")
    ours = in_responses_terms(err)
    assert (ours.param, ours.message) == ("max_output_tokens", "max_output_tokens must be an integer >= 1, got 0")
