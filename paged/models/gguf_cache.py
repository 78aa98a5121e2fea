"""``GGUFCache``: a GGUF file is converted once; later loads read the dense weights back.

Loading a GGUF file is slow where a checkpoint folder is quick. The ``gguf`` reader
parses the header one value at a time (SmolLM2-135M's 49 152 tokens and 48 900 merges:
about 3 s on a 2-core EPYC) and every tensor is dequantized (0.6 s more). What comes
out depends only on the file's bytes, the dtype and the code that converts, so the first
load keeps it and every later load reads it back::

    first load:  model.gguf --parse, dequantize, cast--> Converted --write--> <entry>.safetensors
    later loads: model.gguf --sha256--> key --read, check--> Converted   (no gguf parsing at all)

An entry is one safetensors file: every parameter of the model under its own name (the
fused ``qkv_proj`` and ``gate_up_proj`` included; for a ``quantization="gguf"`` load, an
entry of its own, all but the linears that keep the file's blocks), in the requested dtype, and in the
file's metadata the rest of what the GGUF file gave (``config.json``'s fields,
``tokenizer.json``, the chat template, the special tokens, the warnings of the
conversion, the tensor table) with a sha256 of all of it.

An entry is named by its key, the sha256 of

* the GGUF file's bytes: 60 ms for SmolLM2's 98 MB (the CPU's SHA instructions).
  Size and modification time would cost nothing and are fooled by a file rewritten in
  place with its time kept (``cp -p``, ``rsync -t``) or re-quantized to the same size;
  a hash of a few chunks misses a change between them;
* the dtype (and the quantization, if any);
* the code that converts (``code_hash``): ``paged/models/*.py`` (parameter names, the
  order of the fused rows, the query/key un-permutation, the tokenizer rules) and the
  ``gguf`` package's modules (the dequantizers). Edit either and the next load converts
  again, so an entry always fits the model the code builds.

What must hold (``tests/models/test_gguf_cache.py``):

* weights read from an entry are bitwise the ones the conversion made: safetensors
  keeps each tensor's bytes, so the same float values come back;
* an entry is whole or absent: it is written to a temporary file in the same folder,
  flushed to the disk, then renamed over the entry's name (``os.replace`` is atomic);
* an entry that fails a check (not safetensors, cut short, metadata missing, a sha256
  that differs from the one recorded) is not used: the load warns, converts the GGUF
  file again and rewrites the entry. Never a crash, never wrong weights. A cache that
  cannot be written (a read-only disk, a full one) only warns;
* at most ``KEEP`` entries per GGUF path and dtype (and quantization), the most recently used (a read
  touches its entry), so editing the code does not fill the disk, and two checkouts
  of different code loading the same file do not evict each other.

``PAGED_GGUF_CACHE=0`` turns the cache off (every load converts), ``PAGED_GGUF_CACHE=<folder>``
keeps the entries there; the default is ``$PAGED_CACHE_DIR/gguf`` (``~/.cache/paged/gguf``).
"""

from __future__ import annotations

import dataclasses
import glob
import hashlib
import importlib.util
import json
import os
import tempfile
import warnings
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from paged.models.paths import cache_dir

ENV_VAR = "PAGED_GGUF_CACHE"
OFF = ("0", "off", "false", "no")
KEEP = 2  # entries kept per GGUF path and form (dtype and quantization)


@dataclasses.dataclass
class Converted:
    """What a GGUF file converts to: the dense parameters and plain data for the rest.

    Attributes:
        weights: parameter name (``model.named_parameters()``) -> CPU tensor in the load's dtype.
        hf_config: the ``config.json`` fields (``hf_config.parse_hf_config`` reads them).
        tokenizer_json: the rebuilt tokenizer as ``tokenizer.json`` text, or None when the file has none.
        chat_template: the Jinja chat template, or None.
        special_tokens: the ``bos_token`` / ``eos_token`` strings the template may print.
        warnings: what the conversion warned about, said again at every load.
        tensors: the file's tensor table (``gguf_reader.tensor_table``): GGUF name -> ``[ggml type,
            row-major shape, byte offset, byte count]``, where ``quantized`` finds the blocks it keeps.
    """

    weights: dict[str, torch.Tensor]
    hf_config: dict
    tokenizer_json: str | None
    chat_template: str | None
    special_tokens: dict[str, str]
    warnings: list[str]
    tensors: dict[str, list]

    def header(self) -> str:
        """Everything but the weights, as JSON text (the entry's metadata)."""
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "weights"}
        return json.dumps(fields, sort_keys=True)


def cache_folder() -> Path | None:
    """Where entries live: ``$PAGED_GGUF_CACHE``, else ``$PAGED_CACHE_DIR/gguf``; None when turned off."""
    value = os.environ.get(ENV_VAR, "")
    if value.lower() in OFF:
        return None
    return Path(value) if value else cache_dir() / "gguf"


def file_hash(path: Path) -> str:
    """sha256 of a file's bytes."""
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def code_hash() -> str:
    """sha256 of the sources that decide what a conversion produces: ``paged/models/*.py`` and ``gguf``'s modules."""
    files = sorted(Path(__file__).parent.glob("*.py"))
    spec = importlib.util.find_spec("gguf")  # located, not imported: a read needs no gguf
    if spec is not None and spec.origin:
        files += sorted(Path(spec.origin).parent.glob("*.py"))
    digest = hashlib.sha256()
    for f in files:
        digest.update(f"{f.parent.name}/{f.name}\0".encode())
        digest.update(f.read_bytes())
    return digest.hexdigest()


def content_hash(header: str, weights: dict[str, torch.Tensor]) -> str:
    """sha256 of the header text and of every tensor's name, dtype, shape and bytes, in name order."""
    digest = hashlib.sha256(header.encode())
    for name in sorted(weights):
        t = weights[name]
        digest.update(f"\0{name}\0{t.dtype}\0{list(t.shape)}\0".encode())
        digest.update(t.detach().contiguous().reshape(-1).view(torch.uint8).numpy())
    return digest.hexdigest()


class GGUFCache:
    """The entry of one GGUF file in one dtype: ``read()`` it, or ``write()`` it after converting.

    Args:
        gguf_path: the GGUF file.
        dtype: the dtype of the weights.
        folder: where the entries live.
        quantization: None, or ``"gguf"``: the entry of a quantized load (``convert_gguf``'s weights without
            the linears that keep the file's blocks), kept apart from the dense one.
    """

    def __init__(self, gguf_path: Path, dtype: torch.dtype, folder: Path, quantization: str | None = None):
        self.gguf_path = gguf_path
        form = str(dtype).removeprefix("torch.") + (f"-{quantization}" if quantization else "")
        self.key = hashlib.sha256(f"{file_hash(gguf_path)}|{form}|{code_hash()}".encode()).hexdigest()
        where = hashlib.sha256(str(gguf_path.resolve()).encode()).hexdigest()[:8]
        self.prefix = f"{gguf_path.stem}-{form}-{where}"  # the same for every entry of this path and form
        self.entry = folder / f"{self.prefix}-{self.key[:16]}.safetensors"

    @classmethod
    def for_file(cls, gguf_path: Path, dtype: torch.dtype, quantization: str | None = None) -> GGUFCache | None:
        """The cache entry for ``gguf_path`` in ``dtype`` (for a ``quantization="gguf"`` load: its own entry,
        without the weights the kernel's layers replace), or None when ``PAGED_GGUF_CACHE`` turns the cache off."""
        folder = cache_folder()
        return None if folder is None else cls(gguf_path, dtype, folder, quantization)

    def read(self) -> Converted | None:
        """The entry's contents, or None when there is none or it fails a check (with a warning)."""
        if not self.entry.is_file():
            return None
        try:
            with safe_open(self.entry, framework="pt") as f:
                meta = f.metadata() or {}
                # copied out of the file's mapping before they are checked: a file changed in place
                # later changes nothing a model holds
                weights = {name: f.get_tensor(name).clone() for name in f.keys()}
            header = meta["header"]
            if meta.get("key") != self.key or content_hash(header, weights) != meta["sha256"]:
                raise ValueError("its contents differ from the sha256 recorded when it was written")
            converted = Converted(weights=weights, **json.loads(header))
        except Exception as err:  # safetensors' errors, a missing field, bad JSON: all mean "convert again"
            warnings.warn(f"paged: the cached conversion {self.entry} cannot be used ({type(err).__name__}: {err}); "
                          f"converting {self.gguf_path} again", RuntimeWarning, stacklevel=3)
            return None
        try:
            os.utime(self.entry)  # the most recently used entries are the ones kept
        except OSError:  # a cache one may read but not write is still read
            pass
        return converted

    def write(self, converted: Converted) -> None:
        """Store ``converted`` whole or not at all; a cache that cannot be written only warns."""
        header = converted.header()
        meta = {"header": header, "key": self.key, "sha256": content_hash(header, converted.weights)}
        tmp = None
        try:
            self.entry.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.entry.parent, prefix=f".{self.entry.name}.", suffix=".tmp")
            os.close(fd)
            save_file(converted.weights, tmp, metadata=meta)
            with open(tmp, "rb") as f:
                os.fsync(f.fileno())  # on the disk before it has the entry's name
            os.replace(tmp, self.entry)
            tmp = None
            self._evict()
        except OSError as err:
            warnings.warn(f"paged: could not write the cached conversion {self.entry} ({err}); the next load "
                          f"converts {self.gguf_path} again", RuntimeWarning, stacklevel=3)
        finally:
            if tmp is not None:
                Path(tmp).unlink(missing_ok=True)

    def _evict(self) -> None:
        """Remove this path and form's entries but the ``KEEP`` most recently used."""
        entries = glob.glob(glob.escape(str(self.entry.parent / self.prefix)) + "-*.safetensors")
        for old in sorted(entries, key=os.path.getmtime, reverse=True)[KEEP:]:
            Path(old).unlink(missing_ok=True)
