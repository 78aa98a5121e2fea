"""The demo model's tokenizer: a byte-level BPE trained on the training split.

Byte-level means every byte has a token, so any text (indentation, tabs, non-ASCII
identifiers) encodes and decodes back exactly: the ``ByteLevel`` pre-tokenizer maps
bytes to printable symbols and the ``ByteLevel`` decoder maps them back, and no
normalizer or "clean-up" step touches the text. The GPT-2 splitting regex keeps runs of
spaces together, so indentation becomes a few reusable tokens.

Special tokens (ids 0, 1, 2): :data:`BOS`, :data:`EOS`, :data:`PAD`. Encoding adds BOS
in front (a ``TemplateProcessing`` post-processor stored in ``tokenizer.json``), as
LLaMA tokenizers do, so ``tokenizers``, ``paged`` and ``transformers`` all produce the
same ids for a prompt. Training documents are ``BOS text EOS``.

:func:`save_tokenizer` writes ``tokenizer.json``, ``tokenizer_config.json`` (class
``PreTrainedTokenizerFast``, which ``transformers.AutoTokenizer`` accepts) and
``special_tokens_map.json``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

BOS = "<|bos|>"
EOS = "<|eos|>"
PAD = "<|pad|>"
SPECIAL_TOKENS = [BOS, EOS, PAD]  # ids 0, 1, 2 in this order


def train_tokenizer(texts: Iterable[str], vocab_size: int = 4096) -> Tokenizer:
    """Train a byte-level BPE of ``vocab_size`` tokens (specials included) on ``texts``.

    Raises:
        ValueError: ``vocab_size`` cannot hold the 256 byte symbols and the specials.
    """
    minimum = 256 + len(SPECIAL_TOKENS)
    if vocab_size < minimum:
        raise ValueError(f"vocab_size must be at least {minimum} (bytes + specials), got {vocab_size}")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    bos_id = tok.token_to_id(BOS)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, bos_id)]
    )
    return tok


def save_tokenizer(tok: Tokenizer, out_dir: Path, model_max_length: int) -> None:
    """Write the three tokenizer files of a Hugging Face folder into ``out_dir``."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tok.save(str(out_dir / "tokenizer.json"))
    special = {"bos_token": BOS, "eos_token": EOS, "pad_token": PAD}
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        **special,
        "model_max_length": model_max_length,
        "clean_up_tokenization_spaces": False,  # keep code's spaces exactly
        "add_prefix_space": False,
    }
    (out_dir / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    (out_dir / "special_tokens_map.json").write_text(json.dumps(special, indent=2) + "\n")


def load_tokenizer(model_dir: Path) -> Tokenizer:
    """The ``tokenizers.Tokenizer`` saved in ``model_dir``.

    Raises:
        FileNotFoundError: ``model_dir`` has no ``tokenizer.json``.
    """
    path = Path(model_dir) / "tokenizer.json"
    if not path.is_file():
        raise FileNotFoundError(f"no tokenizer.json in {model_dir}")
    return Tokenizer.from_file(str(path))


def encode_document(tok: Tokenizer, text: str) -> list[int]:
    """``BOS text EOS`` as token ids: the unit the model is trained and evaluated on."""
    ids = tok.encode(text).ids  # the post-processor already put BOS first
    return ids + [tok.token_to_id(EOS)]
