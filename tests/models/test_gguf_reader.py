"""``paged.models.gguf_reader.read_gguf`` against the ``gguf`` package's own reader, on the same files.

Exact: every metadata value (``GGUFReader``'s ``contents()``) equals ours, and every tensor's name,
type, shape, byte count, offset and bytes (dtype, shape and values of the mapped array) are equal,
on a written file that holds every kind of metadata value and on the two models that ``make install``
brings (SmolLM2's Q4_1 file and, where installed, Gemma 3's Q4_K_M file with its 262 144-token
vocabulary and K-quant tensors).
"""

from __future__ import annotations

import gguf
import numpy as np
import pytest

from paged.models import ModelLoadError
from paged.models.default import chat_model_path, gemma3_path
from paged.models.gguf_reader import open_gguf, read_gguf
from tests.gguf_files import write_gguf
from tests.hf_models import build_hf_model

T = gguf.GGMLQuantizationType


def assert_same_as_gguf(path):
    ours, theirs = read_gguf(path), gguf.GGUFReader(path)
    keys = [k for k in theirs.fields if not k.startswith("GGUF.")]  # its own version and counts
    assert sorted(ours.fields) == sorted(keys)
    for key in keys:
        assert ours.fields[key] == theirs.fields[key].contents(), key
    assert [t.name for t in ours.tensors] == [t.name for t in theirs.tensors]
    for a, b in zip(ours.tensors, theirs.tensors):
        assert (a.tensor_type, a.shape.tolist(), a.n_bytes, a.data_offset) == \
            (b.tensor_type, b.shape.tolist(), b.n_bytes, b.data_offset), a.name
        assert a.data.dtype == b.data.dtype and a.data.shape == b.data.shape, a.name
        assert np.array_equal(a.data, b.data, equal_nan=True), a.name


def test_a_written_file_reads_as_gguf_reads_it(tmp_path):
    """Metadata of every value type (strings, ints, floats, a bool, arrays of strings and of numbers)
    and tensors of plain and block types (F32, F16, Q8_0, I32)."""
    hf = build_hf_model("llama")
    path = write_gguf(tmp_path / "m.gguf", hf.state_dict(), hf.config.to_dict(), qtype=T.Q8_0,
                      tensor_types={"blk.0.attn_norm.weight": T.I32, "blk.1.attn_norm.weight": T.F16},
                      sentencepiece=(["<unk>", "<s>", "</s>", "a"], [0.0, 0.0, 0.0, -1.5], [2, 3, 3, 1]))
    writer = gguf.GGUFWriter(tmp_path / "kinds.gguf", "llama")
    writer.add_bool("test.flag", True)
    writer.add_array("test.ints", [1, -2, 3])
    writer.add_float32("test.half", 0.5)
    writer.add_string("test.text", "café ✓")
    writer.add_tensor("t", np.arange(6, dtype=np.float32).reshape(2, 3))
    writer.write_header_to_file(), writer.write_kv_data_to_file(), writer.write_tensors_to_file(), writer.close()
    assert_same_as_gguf(path)
    assert_same_as_gguf(tmp_path / "kinds.gguf")
    kinds = read_gguf(tmp_path / "kinds.gguf").fields
    assert (kinds["test.flag"], kinds["test.ints"], kinds["test.half"], kinds["test.text"]) == (True, [1, -2, 3], 0.5, "café ✓")


def test_smollm2s_file_reads_as_gguf_reads_it():
    assert_same_as_gguf(chat_model_path())


@pytest.mark.slow
@pytest.mark.skipif(gemma3_path() is None, reason="Gemma 3 270M is not installed (make install brings it)")
def test_gemmas_file_reads_as_gguf_reads_it():
    assert_same_as_gguf(gemma3_path())


def test_a_header_cut_short_is_named(tmp_path):
    """Exact: cut inside the metadata, inside the tensor table, and inside a tensor's bytes."""
    hf = build_hf_model("llama")
    data = write_gguf(tmp_path / "m.gguf", hf.state_dict(), hf.config.to_dict()).read_bytes()
    for keep, what in ((100, "truncated"), (len(data) // 2, "truncated"),
                       (len(data) - 1, r"tensor '[^']+' runs past the end of the file")):
        cut = tmp_path / f"cut{keep}.gguf"
        cut.write_bytes(data[:keep])
        with pytest.raises(ModelLoadError, match=rf"cut{keep}\.gguf: unreadable GGUF header .*{what}"):
            open_gguf(cut)
