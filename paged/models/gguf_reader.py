"""Reading a GGUF file: the one reader (``gguf.GGUFReader``) and what the rest of the package takes from it.

A GGUF file is one self-contained checkpoint: the magic bytes ``GGUF``, a header
of typed metadata (``llama.block_count``, ``tokenizer.ggml.tokens``, ...), a
table of tensors (name, dimensions fastest-first, ggml type, offset), then the
tensors' bytes, many of them quantized in blocks. It is parsed once, with the
``gguf`` package published with llama.cpp, when the file is converted
(``gguf_loader.convert_gguf``); what later loads need of it is plain data kept
in the conversion's cache entry, ``tensor_table`` included (where each tensor's
bytes are, for the layers that multiply by them: ``quantized``), so a load that
reads the cache parses no header at all.
"""

from __future__ import annotations

from pathlib import Path

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


def open_gguf(path: Path):
    """A ``gguf.GGUFReader`` over ``path``; a file that is not GGUF or is cut short raises ``ModelLoadError``."""
    try:
        import gguf
    except ImportError:
        raise ModelLoadError(f"{path}: reading GGUF files needs the 'gguf' package (pip install gguf)") from None
    check_gguf_file(path)
    try:
        return gguf.GGUFReader(path)
    except ValueError as err:  # an unknown tensor type number is a ValueError from the enum
        raise ModelLoadError(f"{path}: unreadable GGUF header ({err}); the file may be truncated, or use a "
                             "tensor type this version of the gguf package does not know") from None
    except Exception as err:  # numpy raises on a header that runs past the end of a truncated file
        raise ModelLoadError(f"{path}: unreadable GGUF header ({err}); the file may be truncated") from None


def field(reader, key: str, default=None):
    """A metadata value as plain Python (str, int, float, list), or ``default`` when the key is absent."""
    entry = reader.fields.get(key)
    return default if entry is None else entry.contents()


def row_major_shape(tensor) -> tuple[int, ...]:
    """A ``ReaderTensor``'s shape in PyTorch's order (GGUF lists dimensions fastest-first:
    ``[576, 49152]`` for a 49152 x 576 embedding)."""
    return tuple(int(d) for d in reversed(tensor.shape.tolist()))


def tensor_table(reader) -> dict[str, list]:
    """GGUF tensor name -> ``[ggml type, row-major shape, byte offset in the file, byte count]``: plain data
    (JSON), enough to map a tensor's bytes straight from the file later."""
    return {t.name: [int(t.tensor_type), list(row_major_shape(t)), int(t.data_offset), int(t.n_bytes)]
            for t in reader.tensors}
