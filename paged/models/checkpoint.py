"""What any checkpoint becomes, whatever its file format: the model class, the tensor plan, ``LoadedModel``.

A Hugging Face folder (``loader``) and a GGUF file (``gguf_loader``) are read
differently but land in the same place: ``build_model`` picks the class of the
config's architecture; ``plan_checkpoint`` matches the model's parameters with
the checkpoint's tensors by Hugging Face name (fused projections part by part,
``CausalLM.checkpoint_layout``) and refuses anything missing, unexpected or
misshapen before a weight is read; ``LoadedModel`` is what a load returns.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from paged.models.base import CausalLM
from paged.models.config import ModelConfig, ModelLoadError
from paged.models.gemma import GemmaForCausalLM
from paged.models.llama import LlamaForCausalLM, Phi3ForCausalLM
from paged.models.opt import OPTForCausalLM

MODEL_CLASSES = {"llama": LlamaForCausalLM, "phi3": Phi3ForCausalLM, "gemma": GemmaForCausalLM, "opt": OPTForCausalLM}
# Checkpoint entries that carry no weights of ours: old Llama checkpoints saved the RoPE frequencies.
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


@dataclasses.dataclass
class LoadedModel:
    """What ``load_model`` returns.

    Attributes:
        model: the ``CausalLM`` in eval mode.
        config: its ``ModelConfig``.
        tokenizer: a ``tokenizers.Tokenizer``, or None when the checkpoint has none.
        eos_token_ids: ids that end generation (``generation_config.json``, else ``config.json``).
        path: the folder (or GGUF file) it came from.
        chat_template: the Jinja chat template, or None when the checkpoint has none.
        special_tokens: the ``bos_token`` / ``eos_token`` strings the template may print.
    """

    model: CausalLM
    config: ModelConfig
    tokenizer: object | None
    eos_token_ids: list[int]
    path: Path
    chat_template: str | None = None
    special_tokens: dict = dataclasses.field(default_factory=dict)


def build_model(config: ModelConfig) -> CausalLM:
    """The model class for ``config``'s architecture, built on the current default device."""
    return MODEL_CLASSES[config.architecture](config)


def plan_checkpoint(model: CausalLM, found: dict, path: Path) -> dict[str, list[tuple[str, int, int]]]:
    """Match the model's parameters with checkpoint tensors; raise on anything missing, extra or misshapen.

    Args:
        model: the model (on the meta device is enough: only names and shapes are read).
        found: Hugging Face tensor name -> ``(file, row-major shape, handle)``; an OPT checkpoint saved
            from ``OPTModel`` (``decoder.*``) gets its names prefixed with ``model.`` here.
        path: the checkpoint, for error messages.

    Returns:
        ``model.checkpoint_layout()``: parameter -> ``(checkpoint name, first row, row count)`` parts.

    Raises:
        ModelLoadError: a tensor is missing, unexpected or of the wrong shape (the message names it).
    """
    if found and not any(n.startswith("model.") for n in found):  # e.g. OPT saved from OPTModel: decoder.*
        found.update({f"model.{n}": found.pop(n) for n in list(found) if not n.startswith("lm_head.")})
    layout = model.checkpoint_layout()
    params = dict(model.named_parameters())
    missing, seen = [], set()
    for pname, parts in layout.items():
        shape = tuple(params[pname].shape)
        for ck_name, _, rows in parts:
            if ck_name not in found:
                missing.append(ck_name)
                continue
            seen.add(ck_name)
            file, got, _ = found[ck_name]
            want = (rows, *shape[1:]) if len(parts) > 1 else shape
            if got != want:
                raise ModelLoadError(f"{file}: tensor {ck_name!r} has shape {list(got)}, the config needs {list(want)}")
    if missing:
        more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
        raise ModelLoadError(f"{path}: checkpoint is missing tensors {missing[:5]}{more}")

    def ignorable(name: str) -> bool:  # a tied LM head saved anyway is the embedding again
        return name.endswith(_IGNORED_SUFFIXES) or (model.config.tie_word_embeddings and name == "lm_head.weight")

    unexpected = sorted(n for n in found if n not in seen and not ignorable(n))
    if unexpected:
        more = f" and {len(unexpected) - 5} more" if len(unexpected) > 5 else ""
        raise ModelLoadError(
            f"{found[unexpected[0]][0]}: unexpected tensors {unexpected[:5]}{more} for model_type "
            f"{model.config.model_type!r} with this config"
        )
    return layout
