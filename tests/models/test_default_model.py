"""The default model (paged/models/default.py): the demo fallback says how to fetch the chat model."""

import pytest

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


def test_the_script_fetches_only_the_models_named_and_refuses_an_unknown_name(monkeypatch, tmp_path, capsys):
    """``make serve`` runs ``python -m paged.models.default SmolLM2-135M-Instruct``: Gemma 3 is not fetched."""
    monkeypatch.setenv("PAGED_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(default, "fetch_chat_model", lambda: tmp_path / "smollm2.gguf")
    monkeypatch.setattr(default, "fetch_gemma3", lambda: pytest.fail("Gemma 3 was not asked for"))
    assert default.main(["SmolLM2-135M-Instruct"]) == 0
    assert capsys.readouterr().out == f"SmolLM2-135M-Instruct: {tmp_path / 'smollm2.gguf'} (fetched)\n"
    with pytest.raises(SystemExit, match="unknown model 'nope'; the models it fetches: SmolLM2-135M-Instruct, "):
        default.main(["nope"])
