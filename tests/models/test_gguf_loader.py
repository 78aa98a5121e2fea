"""GGUF files: the same weights, config and tokenizer as the checkpoint folder they were written from.

Each test writes a GGUF file from a tiny Hugging Face checkpoint with
``tests.gguf_files.write_gguf`` (llama.cpp's names, its query/key row order,
its dimension order) and loads it with ``paged.models.load_model``. F32 files
must give back every parameter bitwise (``torch.equal``): loading is a copy
after undoing llama.cpp's layout, no arithmetic. Quantized files are checked
against the quantization's own error bound. Broken files must raise
``ModelLoadError`` naming the file and the problem.
"""

from __future__ import annotations

import json
import shutil

import gguf
import numpy as np
import pytest
import torch

from paged.demo import DEFAULT_MODEL_PATH
from paged.models import ModelLoadError, greedy_generate, load_model
from paged.models.gguf_names import unpermute_rows
from tests.gguf_files import permute_rows, write_gguf
from tests.hf_models import build_hf_model, save_checkpoint

T = gguf.GGMLQuantizationType
MIXED_TEXT = "def f(x):\n\treturn x  *  2   # café ✓ 😀\n\n\n    class  A: pass\r\n"


def _gguf_and_folder(kind, arch, tmp_path, qtype=T.F32):
    hf = build_hf_model(kind)
    folder = save_checkpoint(hf, tmp_path / "folder")
    path = write_gguf(tmp_path / "model.gguf", hf.state_dict(), hf.config.to_dict(), arch=arch, qtype=qtype)
    return path, folder


@pytest.mark.parametrize("kind, arch", [("llama", "llama"), ("llama_tied_bias", "llama"),
                                        ("qwen2", "qwen2"), ("mistral", "mistral")])
def test_gguf_f32_weights_equal_the_folder_bitwise(kind, arch, tmp_path):
    """Bitwise: every parameter of the GGUF load equals the folder load (names, row order, tying, biases)."""
    path, folder = _gguf_and_folder(kind, arch, tmp_path)
    ours, ref = load_model(path, dtype="float32"), load_model(folder, dtype="float32")
    for field in ("model_type", "vocab_size", "hidden_size", "num_layers", "num_heads", "num_kv_heads",
                  "head_dim", "intermediate_size", "rope_theta", "rms_norm_eps", "qkv_bias", "o_bias",
                  "tie_word_embeddings"):
        assert getattr(ours.config, field) == getattr(ref.config, field), field
    want = dict(ref.model.named_parameters())
    for name, p in ours.model.named_parameters():
        assert torch.equal(p, want[name]), name


def test_unpermute_rows_inverts_llama_cpp_order():
    """Bitwise: the loader's row order is the inverse of llama.cpp's converter permutation, and not the identity."""
    w = np.arange(8 * 16 * 3, dtype=np.float32).reshape(8 * 16, 3)
    permuted = permute_rows(w, num_heads=8)
    assert not np.array_equal(permuted, w)
    assert torch.equal(unpermute_rows(torch.from_numpy(permuted), 8), torch.from_numpy(w))


@pytest.mark.parametrize("qtype", [T.Q8_0, T.Q4_0, T.Q4_1, T.F16, T.BF16])
def test_quantized_weights_within_the_quantization_step(qtype, tmp_path):
    """Toleranced: each dequantized weight is within one quantization step of the original.

    A block of 32 values shares one scale ``s``: Q8_0 rounds to ``s = max|w|/127``, Q4_0 to
    ``max|w|/8``, Q4_1 to ``(max - min)/15``; F16 / BF16 round to 11 / 8 significant bits. The
    bound used is that step for the largest block, which a misplaced row (a wrong permutation
    moves whole rows of other heads) exceeds.
    """
    path, folder = _gguf_and_folder("llama", "llama", tmp_path, qtype)
    ours, ref = load_model(path, dtype="float32"), load_model(folder, dtype="float32")
    want = dict(ref.model.named_parameters())
    steps = {T.Q8_0: 1 / 127, T.Q4_0: 1 / 8, T.Q4_1: 2 / 15, T.F16: 2.0**-10, T.BF16: 2.0**-7}
    for name, p in ours.model.named_parameters():
        w = want[name]
        bound = steps[qtype] * w.abs().max() if w.ndim == 2 else 0.0  # norms stay F32: exact
        assert (p - w).abs().max() <= bound, name
        if w.ndim == 2:
            assert not torch.equal(p, w), f"{name}: {qtype.name} was not quantized at all"


@pytest.mark.parametrize("qtype", [T.Q8_0, T.Q4_0, T.Q4_1, T.Q5_0])
def test_the_loaders_dequantizer_is_ggufs_bitwise(qtype, tmp_path):
    """Bitwise: every tensor the loader dequantizes (the kernel's formats by its torch formulas, the rest
    by gguf) is gguf's own numpy dequantization, row-major; the down projection's rows hold an odd
    count of blocks (96 = 3 x 32), so the padding block the torch formulas add is cut again."""
    from paged.models.gguf_loader import dequantize
    from paged.models.gguf_reader import open_gguf, row_major_shape

    path, _ = _gguf_and_folder("llama", "llama", tmp_path, qtype)
    tensors = open_gguf(path).tensors
    assert any(t.tensor_type == qtype and row_major_shape(t)[-1] // 32 % 2 for t in tensors)
    for t in tensors:
        want = torch.from_numpy(np.array(gguf.quants.dequantize(np.asarray(t.data), t.tensor_type),
                                         dtype=np.float32)).reshape(row_major_shape(t))  # a copy: writable
        assert torch.equal(dequantize(t, path), want), t.name


@pytest.fixture(scope="module")
def demo_gguf(tmp_path_factory):
    """The bundled demo model written as an F32 GGUF, with its tokenizer and chat template in the metadata."""
    from safetensors.torch import load_file

    folder = DEFAULT_MODEL_PATH
    hf_config = json.loads((folder / "config.json").read_text())
    template = (folder / "chat_template.jinja").read_text()
    return write_gguf(tmp_path_factory.mktemp("demo") / "demo.gguf", load_file(folder / "model.safetensors"),
                      hf_config, tokenizer_json=folder / "tokenizer.json", chat_template=template)


def test_demo_model_as_gguf_generates_the_same_tokens(demo_gguf):
    """Bitwise: greedy tokens of the GGUF load equal the folder load's (float32, same ids, same code)."""
    ours, ref = load_model(demo_gguf, dtype="float32"), load_model(DEFAULT_MODEL_PATH, dtype="float32")
    prompts = [ref.tokenizer.encode(t).ids for t in ("def add(a, b):", "class Stack:")]
    assert greedy_generate(ours.model, prompts, 8) == greedy_generate(ref.model, prompts, 8)


def test_demo_model_gguf_tokenizer_and_template_equal_the_folder(demo_gguf):
    """Exact: token ids (code, unicode, whitespace runs, special tokens), decoding and the chat template."""
    ours, ref = load_model(demo_gguf), load_model(DEFAULT_MODEL_PATH)
    for text in (MIXED_TEXT, "<|bos|>x = 1<|eos|>", "12345 ümlaut  \t tabs"):
        assert ours.tokenizer.encode(text).ids == ref.tokenizer.encode(text).ids, text
        ids = ref.tokenizer.encode(text, add_special_tokens=False).ids
        assert ours.tokenizer.decode(ids, skip_special_tokens=False) == ref.tokenizer.decode(ids, skip_special_tokens=False)
    assert ours.chat_template == ref.chat_template
    assert ours.special_tokens == ref.special_tokens == {"bos_token": "<|bos|>", "eos_token": "<|eos|>"}
    assert ours.eos_token_ids == [1]


def test_gguf_dtype_auto_is_bfloat16(demo_gguf):
    """Exact: a GGUF file has no dtype of its own; ``auto`` means bfloat16 (float32 when asked)."""
    assert next(load_model(demo_gguf, dtype="auto").model.parameters()).dtype == torch.bfloat16
    assert next(load_model(demo_gguf, dtype="float32").model.parameters()).dtype == torch.float32


# -- files that must be refused ----------------------------------------------------------------------


def _type_offset(path, tensor_name):
    """Byte offset of a tensor's type field in the header (name length, name, n_dims, dims, then the type)."""
    reader = gguf.GGUFReader(path)
    tensor = next(t for t in reader.tensors if t.name == tensor_name)
    return tensor.field.offset + 8 + len(tensor_name.encode()) + 4 + 8 * len(tensor.shape)


def test_refuses_a_file_that_is_not_gguf(tmp_path):
    """Exact message: a safetensors file passed as GGUF is named, with the magic-bytes check."""
    bad = tmp_path / "model.gguf"
    shutil.copy(DEFAULT_MODEL_PATH / "model.safetensors", bad)
    with pytest.raises(ModelLoadError, match=r"model\.gguf: not a GGUF file"):
        load_model(bad)
    with pytest.raises(ModelLoadError, match=r"missing\.gguf: no such file"):
        load_model(tmp_path / "missing.gguf")


def test_refuses_a_truncated_file(demo_gguf, tmp_path):
    """Exact: a file cut short (a partial download) is refused with its name and 'truncated'."""
    data = demo_gguf.read_bytes()
    for keep in (len(data) // 2, 200):  # inside the tensor data; inside the header
        cut = tmp_path / f"cut{keep}.gguf"
        cut.write_bytes(data[:keep])
        with pytest.raises(ModelLoadError, match=rf"cut{keep}\.gguf: .*truncated"):
            load_model(cut)


def test_refuses_unknown_and_unsupported_tensor_types(tmp_path):
    """Exact: a type number gguf does not know, and a known type this loader cannot dequantize (I32)."""
    hf = build_hf_model("llama")
    path = write_gguf(tmp_path / "i32.gguf", hf.state_dict(), hf.config.to_dict(),
                      tensor_types={"blk.0.attn_norm.weight": T.I32})
    with pytest.raises(ModelLoadError, match=r"i32\.gguf: tensor 'blk\.0\.attn_norm\.weight' has type I32"):
        load_model(path)
    unknown = tmp_path / "unknown.gguf"
    data = bytearray(path.read_bytes())
    offset = _type_offset(path, "blk.0.attn_norm.weight")
    data[offset:offset + 4] = (999).to_bytes(4, "little")
    unknown.write_bytes(bytes(data))
    with pytest.raises(ModelLoadError, match=r"unknown\.gguf: unreadable GGUF header .*999"):
        load_model(unknown)


def test_refuses_an_unsupported_architecture_before_reading_tensors(tmp_path):
    """Exact: architecture 'gpt2' is refused by name; the file also has an I32 tensor, which would be
    reported instead if tensors were looked at first."""
    hf = build_hf_model("llama")
    path = write_gguf(tmp_path / "gpt2.gguf", hf.state_dict(), hf.config.to_dict(), arch="gpt2",
                      tensor_types={"blk.0.attn_norm.weight": T.I32})
    with pytest.raises(ModelLoadError, match=r"gpt2\.gguf: architecture 'gpt2' is not supported; "
                                             r"supported: gemma2, gemma3, llama, mistral, phi3, qwen2, qwen3"):
        load_model(path)
