"""Unit tests of ``paged.serve.detokenize``: deltas never split a UTF-8 character, concatenate to the
full decode, and never contain any part of a stop string."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from paged.serve.detokenize import REPLACEMENT, IncrementalDetokenizer, StopHoldback, TextStream

TEXTS = ["def add(a, b):\n    return a + b\n", "print('héllo wörld € 漢字 🙂')\n", "x = 1  # ok\n"] * 10


@pytest.fixture(scope="module")
def bpe():
    from paged.demo.tokenizer import train_tokenizer

    return train_tokenizer(TEXTS, vocab_size=300)


def stream_deltas(tokenizer, ids):
    det = IncrementalDetokenizer(tokenizer)
    return [det.feed(ids[:i]) for i in range(1, len(ids) + 1)]


def test_detokenizer_multibyte_characters_split_across_tokens_are_never_split(bpe):
    text = "naïve € 漢字 🙂🙃 ok"
    ids = bpe.encode(text, add_special_tokens=False).ids
    # the test is only meaningful if some token holds part of a character
    assert any(REPLACEMENT in bpe.decode([i]) for i in ids)
    deltas = stream_deltas(bpe, ids)
    assert all(REPLACEMENT not in d for d in deltas)
    assert "".join(deltas) == bpe.decode(ids) == text
    assert "" in deltas  # output was held back while a character was incomplete


@given(st.text(alphabet="ab €漢🙂\n\té", max_size=30))
def test_detokenizer_concatenated_deltas_equal_full_decode(text):
    from paged.demo.tokenizer import train_tokenizer

    tok = _cached(train_tokenizer)
    ids = tok.encode(text, add_special_tokens=False).ids
    deltas = stream_deltas(tok, ids)
    assert "".join(deltas) == tok.decode(ids) == text
    assert all(REPLACEMENT not in d for d in deltas)


_TOK = {}


def _cached(train):
    if "t" not in _TOK:
        _TOK["t"] = train(TEXTS, vocab_size=300)
    return _TOK["t"]


def test_detokenizer_word_level_spacing_matches_full_decode(tmp_path):
    from tokenizers import Tokenizer

    from tests.hf_models import write_tokenizer

    write_tokenizer(tmp_path, 50)
    tok = Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    ids = [3, 17, 5, 42, 0]
    assert "".join(stream_deltas(tok, ids)) == tok.decode(ids) == "w3 w17 w5 w42 w0"


def test_detokenizer_skips_special_tokens_like_the_engine(bpe):
    ids = bpe.encode("ab", add_special_tokens=False).ids + [1]  # <|eos|>
    assert "".join(stream_deltas(bpe, ids)) == bpe.decode(ids, skip_special_tokens=True) == "ab"


def test_holdback_keeps_possible_stop_prefix_unsent():
    h = StopHoldback(["END", "\n\n"])
    assert h.hold == 2
    assert h.push("abc") == "a"
    assert h.push("E") == "b"  # "cE" could still become "cEND"... only its head is safe
    assert h.push("N") == "c"  # "EN" could become "END": held
    # the engine found "END" and cut the text there
    assert h.finish("abc") == ""
    assert h.text == "abc"


def test_holdback_without_stop_strings_sends_everything_at_once():
    h = StopHoldback(None)
    assert (h.push("abc"), h.push("d"), h.finish("abcd")) == ("abc", "d", "")


def simulate_engine_stream(tokenizer, ids, stop):
    """What the engine does (decode all output each step, cut at the first stop) and what a stream sends."""
    ts, sent, final = TextStream(tokenizer, stop), [], None
    for i in range(1, len(ids) + 1):
        text = tokenizer.decode(ids[:i])
        hits = [text.find(s) for s in stop if s in text]
        if hits:  # the engine finished the sequence: the stream sends the rest of the final text
            final = text[:min(hits)]
            sent.append(ts.finish(final))
            break
        sent.append(ts.feed(ids[:i]))
    else:
        final = tokenizer.decode(ids)
        sent.append(ts.finish(final))
    return sent, final


@pytest.mark.parametrize("stop", [["STOP"], ["\n    return"], ["€ 漢"], ["zzz", "b):"]])
def test_stream_with_stop_strings_spanning_tokens_equals_final_text_and_never_sends_stop(bpe, stop):
    text = "def add(a, b):\n    return a STOP € 漢字 + b\n"
    ids = bpe.encode(text, add_special_tokens=False).ids
    sent, final = simulate_engine_stream(bpe, ids, stop)
    assert "".join(sent) == final
    assert not any(s in final for s in stop)
    assert len(final) < len(text)  # a stop string did end it
    for s in stop:  # no prefix of a stop string leaked beyond the final text
        assert s not in "".join(sent)
