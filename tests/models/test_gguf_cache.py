"""The cache of converted GGUF files: dequantize once, then read the entry (``paged/models/gguf_cache.py``).

Each test points ``PAGED_GGUF_CACHE`` at a folder of its own and writes small GGUF files
with ``tests.gguf_files.write_gguf`` (a tiny Llama in Q4_1, so loading really
dequantizes). The reference is a fresh conversion, ``convert_gguf``, which never looks at
a cache. Weights are compared bitwise (``torch.equal``): an entry stores the bytes of the
float values the conversion made, so reading them back is a copy, no arithmetic.
"""

from __future__ import annotations

import dataclasses
import json
import os
import warnings

import gguf
import pytest
import torch
from safetensors.torch import load_file

from paged.demo import DEFAULT_MODEL_PATH
from paged.models import ModelLoadError, load_model
from paged.models.gguf_cache import KEEP, GGUFCache
from paged.models.gguf_loader import convert_gguf
from tests.gguf_files import write_gguf
from tests.hf_models import build_hf_model

T = gguf.GGMLQuantizationType
MIXED_TEXT = "def f(x):\n\treturn x  *  2   # café ✓ 😀\n\n\n    class  A: pass\r\n<|bos|>12345"


@pytest.fixture(scope="module")
def tiny_models():
    """Three tiny Llamas of one shape with different weights: ``(state_dict, config)`` each."""
    return [(hf.state_dict(), hf.config.to_dict()) for hf in (build_hf_model("llama", seed=s) for s in range(3))]


@pytest.fixture
def cache(tmp_path, monkeypatch):
    folder = tmp_path / "cache"
    monkeypatch.setenv("PAGED_GGUF_CACHE", str(folder))
    return folder


@pytest.fixture
def tiny(tiny_models, tmp_path):
    return write_gguf(tmp_path / "tiny.gguf", *tiny_models[0], qtype=T.Q4_1)


def fresh(path, dtype=torch.float32) -> dict[str, torch.Tensor]:
    """The weights of a conversion that no cache is involved in."""
    return convert_gguf(path, dtype).weights


def assert_weights_equal(loaded, weights: dict[str, torch.Tensor]) -> None:
    params = dict(loaded.model.named_parameters())
    assert params.keys() == weights.keys()
    for name, w in weights.items():
        assert torch.equal(params[name], w), name


def entries(folder) -> list:
    return sorted(folder.glob("*.safetensors"))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
def test_gguf_cache_load_equals_a_fresh_dequantization_bitwise(tiny, cache, dtype):
    """Bitwise: the first load (which writes the entry) and the second (which reads it) both give
    exactly the parameters of a fresh conversion, in the requested dtype."""
    first = load_model(tiny, dtype=dtype)
    assert len(entries(cache)) == 1
    second = load_model(tiny, dtype=dtype)
    want = fresh(tiny, dtype)
    assert_weights_equal(first, want)
    assert_weights_equal(second, want)
    assert next(second.model.parameters()).dtype == dtype


def test_gguf_cache_later_loads_read_the_entry(tiny, cache):
    """Bitwise: a valid entry holding other weights (each one plus 1) is what the next load returns,
    so a load with an entry reads it instead of dequantizing the file again."""
    load_model(tiny)
    entry = GGUFCache.for_file(tiny, torch.float32)
    converted = entry.read()
    marked = dataclasses.replace(converted, weights={n: w + 1 for n, w in converted.weights.items()})
    entry.write(marked)
    assert_weights_equal(load_model(tiny), marked.weights)


def test_gguf_cache_a_changed_file_gets_its_own_entry(tiny_models, tmp_path, cache):
    """Bitwise: a file rewritten in place with other weights, the same size and the same modification
    time, loads its own weights (the key hashes the bytes); at most ``KEEP`` entries per path and
    dtype stay, the most recently used; another dtype is another entry."""
    path = tmp_path / "model.gguf"
    names = []
    for i, model in enumerate(tiny_models):
        before = path.stat() if path.exists() else None
        write_gguf(path, *model, qtype=T.Q4_1)
        if before is not None:
            assert path.stat().st_size == before.st_size
            os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
        loaded = load_model(path)
        assert_weights_equal(loaded, fresh(path))
        names.append(GGUFCache.for_file(path, torch.float32).entry.name)
        assert [e.name for e in entries(cache)] == sorted(names[-KEEP:]), f"version {i}"
    assert len(set(names)) == len(tiny_models)
    load_model(path, dtype=torch.bfloat16)
    assert len(entries(cache)) == KEEP + 1


def test_gguf_cache_a_quantized_load_has_an_entry_of_its_own_without_the_replaced_weights(tiny, cache):
    """Exact: a ``quantization="gguf"`` load writes an entry apart from the dense one, holding every
    parameter but those of the linears that keep the file's blocks (so neither the conversion nor the
    entry dequantizes them), bitwise the dense conversion's for the rest; the next quantized load reads
    it, and the dense entry stays whole."""
    from paged.models.quantized import QuantizedLinear

    dense = load_model(tiny)
    quant = load_model(tiny, quantization="gguf")
    assert len(entries(cache)) == 2
    replaced = {n for n, m in quant.model.named_modules() if isinstance(m, QuantizedLinear)}
    stored = GGUFCache.for_file(tiny, torch.float32, "gguf").read().weights
    full = fresh(tiny)
    assert replaced and stored.keys() == {n for n in full if n.rpartition(".")[0] not in replaced}
    assert all(torch.equal(stored[n], full[n]) for n in stored)
    assert_weights_equal(dense, full)
    assert_weights_equal(load_model(tiny, quantization="gguf"), stored)
    assert len(entries(cache)) == 2


def _cut_in_half(data: bytes) -> bytes:
    return data[: len(data) // 2]


def _flip_a_weight_bit(data: bytes) -> bytes:
    return data[:-5] + bytes([data[-5] ^ 0x10]) + data[-4:]  # inside the last tensor's bytes


def _rename_a_config_field(data: bytes) -> bytes:
    """Still valid JSON and still a readable entry, but its header is not the one recorded."""
    assert data.count(b"rms_norm_eps") == 1
    return data.replace(b"rms_norm_eps", b"rms_norm_ept")


DAMAGE = {
    "cut in half": _cut_in_half,
    "cut to 4 bytes": lambda data: data[:4],
    "empty": lambda data: b"",
    "not safetensors": lambda data: b"GGUF" + bytes(1000),
    "one bit of a weight flipped": _flip_a_weight_bit,
    "a config field renamed": _rename_a_config_field,
}


@pytest.mark.parametrize("damage", DAMAGE.values(), ids=DAMAGE.keys())
def test_gguf_cache_a_damaged_entry_is_rebuilt(tiny, cache, damage):
    """Bitwise: a load over a damaged entry warns, gives the weights of a fresh conversion (not the
    damaged ones, and no crash), and rewrites the entry, which the next load reads without a warning."""
    load_model(tiny)
    [entry] = entries(cache)
    entry.write_bytes(damage(entry.read_bytes()))
    with pytest.warns(RuntimeWarning, match="cached conversion .* cannot be used"):
        loaded = load_model(tiny)
    assert_weights_equal(loaded, fresh(tiny))
    assert entries(cache) == [entry]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the rewritten entry passes its checks
        assert_weights_equal(load_model(tiny), load_file(entry))


def test_gguf_cache_off_switch(tiny, tmp_path, monkeypatch):
    """Bitwise: with ``PAGED_GGUF_CACHE=0`` a load ignores an entry (one holding other weights is not
    read) and writes none; unset, entries go to ``$PAGED_CACHE_DIR/gguf``."""
    monkeypatch.setenv("PAGED_CACHE_DIR", str(tmp_path / "home"))
    monkeypatch.delenv("PAGED_GGUF_CACHE", raising=False)
    load_model(tiny)
    [entry] = entries(tmp_path / "home" / "gguf")
    converted = GGUFCache.for_file(tiny, torch.float32).read()
    GGUFCache.for_file(tiny, torch.float32).write(
        dataclasses.replace(converted, weights={n: w + 1 for n, w in converted.weights.items()}))
    for off in ("0", "off"):
        monkeypatch.setenv("PAGED_GGUF_CACHE", off)
        assert GGUFCache.for_file(tiny, torch.float32) is None
        assert_weights_equal(load_model(tiny), fresh(tiny))
    monkeypatch.setenv("PAGED_CACHE_DIR", str(tmp_path / "other"))
    load_model(tiny)
    assert not (tmp_path / "other").exists()


def test_gguf_cache_that_cannot_be_written_only_warns(tiny, tmp_path, monkeypatch):
    """Bitwise: when the cache folder cannot be made (a file stands in its way), the load warns and
    still gives the fresh conversion's weights."""
    (tmp_path / "a_file").write_text("")
    monkeypatch.setenv("PAGED_GGUF_CACHE", str(tmp_path / "a_file" / "cache"))
    with pytest.warns(RuntimeWarning, match="could not write the cached conversion"):
        loaded = load_model(tiny)
    assert_weights_equal(loaded, fresh(tiny))


def test_gguf_cache_keeps_the_tokenizer_template_and_warnings(tmp_path, cache):
    """Exact: loaded from its entry, the demo model (as GGUF, with a pre-tokenizer name the loader does
    not know) has the same token ids, decoding, chat template, special tokens, EOS ids and config as
    when converted, and the conversion's warning is said again."""
    folder = DEFAULT_MODEL_PATH
    path = write_gguf(tmp_path / "demo.gguf", load_file(folder / "model.safetensors"),
                      json.loads((folder / "config.json").read_text()), tokenizer_json=folder / "tokenizer.json",
                      chat_template=(folder / "chat_template.jinja").read_text(), tokenizer_pre="mystery")
    loads = []
    for _ in range(2):
        with pytest.warns(UserWarning, match="pre-tokenizer 'mystery' is not known"):
            loads.append(load_model(path))
    assert len(entries(cache)) == 1
    converted, cached = loads
    ids = converted.tokenizer.encode(MIXED_TEXT).ids
    assert cached.tokenizer.encode(MIXED_TEXT).ids == ids
    assert cached.tokenizer.decode(ids, skip_special_tokens=False) == converted.tokenizer.decode(
        ids, skip_special_tokens=False)
    assert cached.chat_template == converted.chat_template is not None
    assert cached.special_tokens == converted.special_tokens == {"bos_token": "<|bos|>", "eos_token": "<|eos|>"}
    assert cached.eos_token_ids == converted.eos_token_ids
    assert cached.config == converted.config


def test_gguf_cache_an_entry_that_does_not_fit_the_model_is_refused(tiny, cache):
    """Exact: an entry that passes its checks but lacks a parameter (only a bug in the conversion could
    write one: the code's hash is in the key) raises ``ModelLoadError`` naming the file, instead of
    leaving that parameter uninitialised."""
    load_model(tiny)
    entry = GGUFCache.for_file(tiny, torch.float32)
    converted = entry.read()
    del converted.weights["model.norm.weight"]
    entry.write(converted)
    with pytest.raises(ModelLoadError, match=r"tiny\.gguf: the converted weights do not fit the model "
                                             r"\(missing \['model\.norm\.weight'\]"):
        load_model(tiny)


def test_gguf_cache_read_only_is_still_read(tiny, cache, monkeypatch):
    """Bitwise: an entry whose modification time cannot be touched (a cache shared read-only) is still
    read: its weights, not a fresh conversion's, come back."""
    load_model(tiny)
    entry = GGUFCache.for_file(tiny, torch.float32)
    converted = entry.read()
    marked = dataclasses.replace(converted, weights={n: w + 1 for n, w in converted.weights.items()})
    entry.write(marked)

    def refuse(*args, **kwargs):
        raise PermissionError("read-only file system")

    monkeypatch.setattr(os, "utime", refuse)
    assert_weights_equal(load_model(tiny), marked.weights)
