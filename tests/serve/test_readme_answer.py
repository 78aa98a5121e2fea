"""README.md quotes what a fresh clone's ``make serve`` answers; this test asks a server started the same way.

``python -m paged.serve`` with no model, no dtype and no cache size given (the defaults of ``make
serve``: the default model, bfloat16 for its GGUF file, the prefix cache on) gets the README's request
(``tools/readme_answer.py``); the answer, its completion token count and its finish reason must be
the ones README.md quotes, exactly, on the kind of CPU the README names. Greedy decoding in the default
batch-invariant mode makes the answer a function of the model, the code and the CPU's kind (another
kind sums in another order, and a near-tie may go the other way): on another kind the answer must be
a whole one (it stops, or reaches ``max_tokens``), not the quote. When a change moves it, rewrite the
quote with ``python tools/readme_answer.py --write`` against a running server. Skipped without a chat
model.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from paged.models.default import default_model
from tests.serve.conftest import Server

_SPEC = importlib.util.spec_from_file_location("readme_answer", Path(__file__).parents[2] / "tools" / "readme_answer.py")
readme_answer = sys.modules["readme_answer"] = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(readme_answer)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200), pytest.mark.skipif(
    default_model()[1] == "paged-demo", reason="no chat model is fetched (make install fetches it); the README "
                                               "quotes the default chat model")]


def test_readme_quotes_what_make_serve_answers():
    """Exact, on the CPU kind the README names: the README's quoted answer, token count and finish reason
    are the default server's."""
    server = Server(default_model()[0], ["--dtype", "auto"])  # the fixture's float32 undone: make serve's defaults
    try:
        live = readme_answer.ask(server.url)
    finally:
        server.stop()
    if readme_answer.cpu_kind() != readme_answer.quoted_kind():
        assert live[0] and live[2] in ("stop", "length") and 0 < live[1] <= readme_answer.REQUEST["max_tokens"]
        return
    assert live == readme_answer.quoted(), f"README.md is stale; the default server answers ({live[1]} tokens, " \
                                           f"{live[2]}):\n{live[0]}"


def test_cpu_kind_reads_the_flags_that_change_the_sums():
    """Exact: AMX before AVX-512 BF16 before AVX-512 before AVX2, from /proc/cpuinfo's flags."""
    assert readme_answer.cpu_kind("flags : fpu avx2 avx512f avx512_bf16 amx_bf16") == "AMX"
    assert readme_answer.cpu_kind("flags : fpu avx2 avx512f avx512_bf16") == "AVX-512 BF16"
    assert readme_answer.cpu_kind("flags : fpu avx2 avx512f") == "AVX-512"
    assert readme_answer.cpu_kind("flags : fpu avx2") == "AVX2"
    assert readme_answer.cpu_kind("flags : fpu sse2") == "another kind"


def test_readme_quote_is_found_and_rewritten_in_place(tmp_path, monkeypatch):
    """Exact: ``write`` replaces the answer, count and finish reason and nothing else; a README without
    the quote is refused."""
    original = readme_answer.README.read_text()
    copy = tmp_path / "README.md"
    copy.write_text(original)
    monkeypatch.setattr(readme_answer, "README", copy)
    readme_answer.write("def f(xs):\n    return xs[::-1]", 12, "length", kind="AVX2")
    assert readme_answer.quoted() == ("def f(xs):\n    return xs[::-1]", 12, "length")
    assert readme_answer.quoted_kind() == "AVX2"
    before, after = original.split("````text")[0], copy.read_text().split("````text")[0]
    kind, tokens = readme_answer.quoted_kind(original), readme_answer.quoted(original)[1]
    assert before.replace(f"a CPU with {kind}; {tokens} tokens", "a CPU with AVX2; 12 tokens").replace(
        f'"{readme_answer.quoted(original)[2]}"', '"length"') == after
    copy.write_text("no quote here")
    with pytest.raises(ValueError, match="quoted answer"):
        readme_answer.quoted()
