"""The default model (paged/models/default.py): the demo fallback says how to fetch the chat model."""

from paged.models import default


def test_the_demo_fallback_says_once_how_to_fetch_the_chat_model(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("PAGED_CACHE_DIR", str(tmp_path))  # an empty cache: SmolLM2 not fetched
    default._say_how_to_fetch_once.cache_clear()
    assert default.default_model() == (str(default.DEFAULT_MODEL_PATH), "paged-demo")
    default.default_model()
    said = capsys.readouterr().err
    assert said.count("Fetch SmolLM2-135M-Instruct (98 MB) with: python -m paged.models.default") == 1, said
    assert f"SmolLM2-135M-Instruct is not in {tmp_path}" in said


def test_a_fetched_chat_model_is_the_default_and_nothing_is_said(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("PAGED_CACHE_DIR", str(tmp_path))
    default._say_how_to_fetch_once.cache_clear()
    default.chat_model_path().touch()
    assert default.default_model() == (str(default.chat_model_path()), "SmolLM2-135M-Instruct")
    assert capsys.readouterr().err == ""
