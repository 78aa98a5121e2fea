"""``load_model``: a Hugging Face checkpoint folder or a GGUF file -> a ready ``CausalLM``, tokenizer and EOS ids.

Reads ``config.json``, the ``*.safetensors`` files (one, or the shards named
by ``model.safetensors.index.json``), ``tokenizer.json`` (optional, through
the ``tokenizers`` library) and ``generation_config.json`` (optional, for the
EOS ids). Everything is checked before any memory is allocated for weights:
the config, every tensor name (missing and unexpected) and every shape, read
from the safetensors headers. A folder that fails a check raises
``ModelLoadError`` naming the file and the problem; nothing half-loads.
The model is built on the meta device, materialised once in the target dtype
and device, and each checkpoint tensor is copied into its place (fused
projections part by part). With ``shard`` (tensor parallelism, step06) the
meta model is first cut down to one rank's modules and each parameter reads
only its slice of the checkpoint tensors (safetensors ``get_slice``), so a
rank never holds the whole model. A ``.gguf`` file goes through
``gguf_loader`` instead; both build the model and check the tensors with
``checkpoint`` (``build_model``, ``plan_checkpoint``).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open

from paged.models.chat_template import read_chat_template
from paged.models.checkpoint import LoadedModel, build_model, plan_checkpoint
from paged.models.config import ModelConfig, ModelLoadError, parse_dtype
from paged.models.gguf_loader import load_gguf
from paged.models.gguf_reader import is_gguf
from paged.models.hf_config import parse_hf_config
from paged.models.quantized import QUANTIZATIONS

INDEX_FILE = "model.safetensors.index.json"


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise ModelLoadError(f"{path}: cannot read JSON ({err})") from None


def read_config(path: str | Path) -> ModelConfig:
    """Parse ``path/config.json``; raises ``ModelLoadError`` if it is missing or unsupported."""
    path = Path(path)
    if not path.is_dir():
        raise ModelLoadError(f"{path}: not a directory (expected a checkpoint folder with config.json, "
                             "or a .gguf file)")
    config_file = path / "config.json"
    if not config_file.is_file():
        raise ModelLoadError(f"{config_file}: missing (a checkpoint folder needs config.json)")
    return parse_hf_config(_read_json(config_file), source=str(config_file))


def _checkpoint_index(path: Path) -> dict[str, tuple[Path, tuple[int, ...], str]]:
    """Tensor name -> (file, shape, name stored in the file), from the safetensors headers only."""
    index_file = path / INDEX_FILE
    if index_file.is_file():
        weight_map = _read_json(index_file).get("weight_map")
        if not isinstance(weight_map, dict):
            raise ModelLoadError(f"{index_file}: has no 'weight_map' object")
        files = sorted({path / f for f in weight_map.values()})
        for f in files:
            if not f.is_file():
                raise ModelLoadError(f"{f}: missing, but {index_file.name} lists it as a shard")
    else:
        weight_map = None
        files = sorted(path.glob("*.safetensors"))
        if not files:
            has_bin = any(path.glob("*.bin"))
            extra = " (pytorch_model.bin is not supported; convert it to safetensors)" if has_bin else ""
            raise ModelLoadError(f"{path}: no *.safetensors file{extra}")
    found: dict[str, tuple[Path, tuple[int, ...], str]] = {}
    for f in files:
        try:
            with safe_open(f, framework="pt") as st:
                for name in st.keys():
                    if name in found:
                        raise ModelLoadError(f"{f}: tensor {name!r} also appears in {found[name][0].name}")
                    found[name] = (f, tuple(st.get_slice(name).get_shape()), name)
        except ModelLoadError:
            raise
        except Exception as err:  # safetensors raises its own error types for corrupt headers
            raise ModelLoadError(f"{f}: not a readable safetensors file ({err})") from None
    if weight_map is not None:
        for name, fname in weight_map.items():
            if name not in found or found[name][0].name != fname:
                raise ModelLoadError(f"{path / fname}: does not contain {name!r} although {INDEX_FILE} says so")
    return found


def _eos_ids(path: Path, config: ModelConfig) -> list[int]:
    gen_file = path / "generation_config.json"
    if gen_file.is_file():
        eos = _read_json(gen_file).get("eos_token_id")
        if eos is not None:
            return [eos] if isinstance(eos, int) else [int(e) for e in eos]
    return list(config.eos_token_ids)


def _tokenizer(path: Path):
    tok_file = path / "tokenizer.json"
    if not tok_file.is_file():
        return None
    from tokenizers import Tokenizer

    try:
        return Tokenizer.from_file(str(tok_file))
    except Exception as err:
        raise ModelLoadError(f"{tok_file}: cannot be read by tokenizers ({err})") from None


def check_quantization(quantization, path: Path, gguf: bool, dtype, device) -> None:
    """Raise ``ValueError`` unless ``quantization`` can serve this file in this dtype on this device."""
    if quantization not in QUANTIZATIONS:
        raise ValueError(f"quantization must be None or one of {', '.join(map(repr, QUANTIZATIONS))}, "
                         f"got {quantization!r}")
    if not gguf:
        raise ValueError(f"quantization={quantization!r} reads a GGUF file's quantized blocks; {path} is not a "
                         ".gguf file")
    if torch.device(device).type != "cpu":
        raise ValueError(f"quantization={quantization!r} runs on the CPU only, got device={str(device)!r}")
    if dtype != "auto" and parse_dtype(dtype) not in (torch.float32, torch.bfloat16):
        raise ValueError(f"quantization={quantization!r} runs in float32 or bfloat16, got dtype={dtype!r}")


def load_model(
    path: str | Path, dtype: str | torch.dtype = torch.float32, device: str | torch.device = "cpu",
    shard=None, quantization: str | None = None,
) -> LoadedModel:
    """Load a Hugging Face checkpoint folder or a GGUF file.

    Args:
        path: folder with ``config.json`` and ``*.safetensors`` (and optionally ``tokenizer.json``,
            ``generation_config.json``, a chat template), or a ``.gguf`` file.
        dtype: ``torch.float32`` / ``bfloat16`` / ``float16`` / ``float64`` or its name; ``"auto"`` takes
            the checkpoint's ``torch_dtype`` (float32 when it names none; bfloat16 for a GGUF file,
            whose quantized weights have no dtype of their own).
        device: where the weights go.
        shard (Callable | None): optional ``shard(model, layout) -> reads``, called once the checkpoint is checked, with
            the model still on the meta device and ``checkpoint_layout()``: it replaces the modules of
            one tensor-parallel rank and returns, per parameter, ``(checkpoint name, first row, row
            count, index)`` entries, ``index`` being the slice of the checkpoint tensor to read (None:
            all of it). Rows no entry fills (vocabulary padding) are zeros.
        quantization: None (dense weights in ``dtype``) or ``"gguf"``: a GGUF file's linear layers
            keep the file's quantized blocks (``paged.models.quantized``; CPU, float32 or bfloat16).

    Returns:
        a ``LoadedModel``.

    Raises:
        ModelLoadError: the folder cannot be loaded; the message names the file and the problem.
        ValueError: ``dtype`` is not one of the supported ones.
    """
    path = Path(path)
    gguf = path.suffix == ".gguf" or is_gguf(path)
    if quantization is not None:
        check_quantization(quantization, path, gguf, dtype, device)
    if gguf:
        if shard is not None:
            raise ModelLoadError(f"{path}: tensor parallelism is not supported for GGUF files")
        dtype = torch.bfloat16 if dtype == "auto" else parse_dtype(dtype)
        return load_gguf(path, dtype, device, quantization)
    config = read_config(path)
    dtype = (config.torch_dtype or torch.float32) if dtype == "auto" else parse_dtype(dtype)
    with torch.device("meta"):
        model = build_model(config)
    if shard is not None and not model.tp_plan:
        raise ModelLoadError(f"{path}: tensor parallelism is not supported for model_type {config.model_type!r}")
    found = _checkpoint_index(path)
    layout = plan_checkpoint(model, found, path)
    tokenizer = _tokenizer(path)
    eos = _eos_ids(path, config)
    template, specials = read_chat_template(path)

    reads = {p: [(ck, row, rows, None) for ck, row, rows in parts] for p, parts in layout.items()}
    if shard is not None:
        reads = shard(model, layout)
    model = model.materialise(dtype, device)
    params = dict(model.named_parameters())
    by_file: dict[Path, list[tuple[str, str, int, int, tuple | None]]] = {}
    for pname, parts in reads.items():
        for ck_name, row, rows, index in parts:
            file, _, stored = found[ck_name]
            by_file.setdefault(file, []).append((stored, pname, row, rows, index))
    with torch.no_grad():
        if shard is not None:
            for p in params.values():
                p.zero_()
        for file, entries in by_file.items():
            try:
                with safe_open(file, framework="pt") as st:
                    for stored, pname, row, rows, index in entries:
                        src = st.get_tensor(stored) if index is None else st.get_slice(stored)[index]
                        params[pname][row : row + rows].copy_(src)
            except Exception as err:  # a truncated or corrupt file: the half-filled model is dropped
                raise ModelLoadError(f"{file}: reading the tensors failed ({err})") from None
    model.reset_buffers()
    model.eval()
    return LoadedModel(model=model, config=config, tokenizer=tokenizer, eos_token_ids=eos, path=path,
                       chat_template=template, special_tokens=specials)
