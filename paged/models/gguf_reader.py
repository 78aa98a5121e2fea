"""Reading a GGUF file: its header parsed here, and what the rest of the package takes from it.

A GGUF file is one self-contained checkpoint: the magic bytes ``GGUF``, a header
of typed metadata (``llama.block_count``, ``tokenizer.ggml.tokens``, ...), a
table of tensors (name, dimensions fastest-first, ggml type, offset), then the
tensors' bytes, many of them quantized in blocks. ``read_gguf`` parses the
header with ``struct`` (the layout is spelled out in its docstring) and maps the
tensors' bytes straight from the file; the ``gguf`` package published with
llama.cpp supplies the type numbers, block sizes and dequantizers. It reads the
file once, when it is converted (``gguf_loader.convert_gguf``); what later loads
need of it is plain data kept in the conversion's cache entry, ``tensor_table``
included (where each tensor's bytes are, for the layers that multiply by them:
``quantized``), so a load that reads the cache parses no header at all.
(``gguf.GGUFReader`` reads the same header but builds a numpy view for every
element of every array: 12.5 s for Gemma 3's 262 144-token vocabulary, where
this reader takes 0.35 s (docs/benchmarks.md, "Start-up time"); tests/models/test_gguf_reader.py holds the
two to the same values.)
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from paged.models.config import ModelLoadError

GGUF_MAGIC = b"GGUF"


def is_gguf(path: str | Path) -> bool:
    """True when ``path`` is a file that starts with GGUF's magic bytes."""
    path = Path(path)
    if not path.is_file():
        return False
    with path.open("rb") as f:
        return f.read(4) == GGUF_MAGIC


def check_gguf_file(path: Path) -> None:
    """Raise ``ModelLoadError`` unless ``path`` is a file that starts with GGUF's magic bytes."""
    if not path.is_file():
        raise ModelLoadError(f"{path}: no such file")
    if not is_gguf(path):
        raise ModelLoadError(f"{path}: not a GGUF file (it does not start with the bytes 'GGUF')")


# GGUF's value types: the scalars as struct formats (little-endian), then STRING = 8 and ARRAY = 9
SCALAR_FORMATS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
STRING, ARRAY = 8, 9
DEFAULT_ALIGNMENT = 32  # where the tensors' bytes start: the header's end, rounded up to this (or general.alignment)
# tensor types whose bytes are plain numbers (the rest are blocks: bytes, per row of the fastest dimension)
PLAIN_TENSOR_DTYPES = {"F32": np.float32, "F16": np.float16, "F64": np.float64, "I8": np.int8, "I16": np.int16,
                       "I32": np.int32, "I64": np.int64}


@dataclass
class GGUFTensor:
    """One entry of the tensor table: ``shape`` fastest-first as stored, ``data`` its bytes mapped from the
    file (numbers shaped row-major, or for block types uint8 ``[..., bytes per row]``)."""

    name: str
    tensor_type: object  # gguf.GGMLQuantizationType
    shape: np.ndarray
    n_bytes: int
    data_offset: int
    data: np.ndarray


@dataclass
class GGUFFile:
    """A GGUF header: ``fields`` (key -> plain Python value: int, float, bool, str or list) and ``tensors``."""

    fields: dict
    tensors: list


def read_gguf(path: Path) -> GGUFFile:
    """Parse ``path``'s header; the tensors' bytes stay in the file, mapped. Raises ValueError (a type number
    it does not know, a string, array or tensor that runs past the end) or struct.error (a number cut off).

    Layout (little-endian): ``GGUF``, version u32 (2 or 3), tensor count u64, metadata count u64; each
    metadata entry a key (string), a value type u32 and the value (a string is a u64 length and UTF-8
    bytes; an array an element type u32, a count u64 and the elements); each tensor a name, a dimension
    count u32, the dimensions u64 (fastest first), a ggml type u32 and an offset u64 from the start of
    the tensor data, which begins at the header's end rounded up to ``general.alignment``."""
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    data = np.memmap(path, dtype=np.uint8, mode="r")
    buf = memoryview(data)
    pos = 0

    def take(fmt: str):  # one little-endian number
        nonlocal pos
        (number,) = struct.unpack_from("<" + fmt, buf, pos)
        pos += struct.calcsize("<" + fmt)
        return number

    def string() -> str:
        nonlocal pos
        n = take("Q")
        if pos + n > len(buf):
            raise ValueError(f"a string of {n} bytes runs past the end of the file at byte {pos}")
        text = bytes(buf[pos:pos + n]).decode("utf-8")
        pos += n
        return text

    def value(kind: int):
        nonlocal pos
        if kind == STRING:
            return string()
        if kind == ARRAY:
            item, count = take("I"), take("Q")
            if item in SCALAR_FORMATS and SCALAR_FORMATS[item] != "?":  # numbers: one read for all
                dtype = np.dtype("<" + SCALAR_FORMATS[item])
                end = pos + count * dtype.itemsize
                if end > len(buf):
                    raise ValueError(f"an array of {count} numbers runs past the end of the file at byte {pos}")
                out = np.frombuffer(buf[pos:end], dtype=dtype).tolist()
                pos = end
                return out
            return [value(item) for _ in range(count)]
        if kind not in SCALAR_FORMATS:
            raise ValueError(f"unknown metadata value type {kind} at byte {pos}")
        return take(SCALAR_FORMATS[kind])

    if bytes(buf[:4]) != GGUF_MAGIC:
        raise ValueError("not a GGUF file")
    pos = 4
    version, n_tensors, n_fields = take("I"), take("Q"), take("Q")
    if version not in (2, 3):
        raise ValueError(f"GGUF version {version}; this reader takes 2 and 3")
    fields = {}
    for _ in range(n_fields):
        key = string()
        fields[key] = value(take("I"))
    table = []
    for _ in range(n_tensors):
        name = string()
        dims = [take("Q") for _ in range(take("I"))]
        table.append((name, dims, GGMLQuantizationType(take("I")), take("Q")))
    alignment = fields.get("general.alignment", DEFAULT_ALIGNMENT)
    if not isinstance(alignment, int) or alignment <= 0 or alignment & (alignment - 1):
        raise ValueError(f"general.alignment must be a power of two, got {alignment!r}")
    start = -(-pos // alignment) * alignment
    tensors, names = [], set()
    for name, dims, kind, offset in table:
        if name in names:
            raise ValueError(f"tensor {name!r} is listed twice")
        names.add(name)
        block, block_bytes = GGML_QUANT_SIZES[kind]
        count = int(np.prod(dims))
        n_bytes = count * block_bytes // block
        at = start + offset
        if at + n_bytes > len(buf):
            raise ValueError(f"tensor {name!r} runs past the end of the file (truncated)")
        row_major = tuple(reversed(dims))
        if kind.name in PLAIN_TENSOR_DTYPES:
            array = data[at:at + n_bytes].view(PLAIN_TENSOR_DTYPES[kind.name]).reshape(row_major)
        else:
            array = data[at:at + n_bytes].reshape(*row_major[:-1], row_major[-1] // block * block_bytes)
        tensors.append(GGUFTensor(name, kind, np.array(dims, dtype=np.uint64), n_bytes, at, array))
    return GGUFFile(fields, tensors)


def open_gguf(path: Path) -> GGUFFile:
    """``path``'s header (``read_gguf``); a file that is not GGUF or is cut short raises ``ModelLoadError``."""
    try:
        import gguf  # noqa: F401  (its type tables)
    except ImportError:
        raise ModelLoadError(f"{path}: reading GGUF files needs the 'gguf' package (pip install gguf)") from None
    check_gguf_file(path)
    try:
        return read_gguf(path)
    except struct.error as err:  # the header runs past the end of the file
        raise ModelLoadError(f"{path}: unreadable GGUF header ({err}); the file may be truncated") from None
    except ValueError as err:  # an unknown tensor type number is a ValueError from the enum
        raise ModelLoadError(f"{path}: unreadable GGUF header ({err}); the file may be truncated, or use a "
                             "tensor type this version of the gguf package does not know") from None


def field(reader: GGUFFile, key: str, default=None):
    """A metadata value as plain Python (str, int, float, bool, list), or ``default`` when the key is absent."""
    return reader.fields.get(key, default)


def row_major_shape(tensor) -> tuple[int, ...]:
    """A ``ReaderTensor``'s shape in PyTorch's order (GGUF lists dimensions fastest-first:
    ``[576, 49152]`` for a 49152 x 576 embedding)."""
    return tuple(int(d) for d in reversed(tensor.shape.tolist()))


def tensor_table(reader) -> dict[str, list]:
    """GGUF tensor name -> ``[ggml type, row-major shape, byte offset in the file, byte count]``: plain data
    (JSON), enough to map a tensor's bytes straight from the file later."""
    return {t.name: [int(t.tensor_type), list(row_major_shape(t)), int(t.data_offset), int(t.n_bytes)]
            for t in reader.tensors}
