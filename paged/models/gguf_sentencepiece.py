"""A SentencePiece vocabulary in a GGUF file (``tokenizer.ggml.model = "llama"``) as a ``tokenizers`` BPE.

Llama 2, Mistral, Phi-3 and Gemma files keep a SentencePiece BPE vocabulary:
the pieces by id (a word-initial space spelt ``▁``), a score per piece, a type
per piece (normal, control, user-defined, byte: ``<0x41>``), and no merge list.
``sentencepiece_tokenizer`` rebuilds what their ``tokenizer.json`` would have
said, the way transformers reads these files:

* **merges** from the vocabulary (``merges_from_vocabulary``): every split of a
  piece into two pieces of the vocabulary is a merge, ranked by the piece's
  score, best first (Gemma: by the piece's place in the file, whose scores do not
  follow its merge order), then the longer left part, then the longer right part;
* **byte fallback**: a character with no piece becomes its UTF-8 bytes' pieces;
* **spaces**: ``▁`` for a space, with a ``▁`` put before the text (Llama 2,
  Mistral: a Metaspace pre-tokenizer; Phi-3: a normalizer), or not (Gemma, whose
  pieces of several spaces are stored as real spaces and renamed ``▁▁``…);
* the decoder turns ``▁`` back into spaces, fuses byte pieces into characters
  and (when a ``▁`` was put before the text) drops the first space.
"""

from __future__ import annotations

SPACE = "\u2581"  # SentencePiece's visible space
_GEMMA = ("gemma", "gemma2", "gemma3")


def merges_from_vocabulary(tokens: list[str], scores: list[float]) -> list[tuple[str, str]]:
    """The BPE merges a SentencePiece vocabulary implies, best first.

    Args:
        tokens: the pieces by id.
        scores: one rank per piece, higher merged first.

    Every way to cut a piece into two pieces of the vocabulary is a merge of that
    piece's score; ties go to the longer left part, then the longer right part, then
    the piece that comes first, then the cut whose left and right parts come first.
    """
    ids = {}
    for i, token in enumerate(tokens):
        ids.setdefault(token, i)
    ranked = []  # (score, len left, len right, order, left, right)
    for token, score in zip(tokens, scores):
        cuts = [(token[:k], token[k:]) for k in range(1, len(token)) if token[:k] in ids and token[k:] in ids]
        cuts.sort(key=lambda cut: (ids[cut[0]], ids[cut[1]]))
        ranked += [(score, len(left), len(right), len(ranked) + n, left, right) for n, (left, right) in enumerate(cuts)]
    ranked.sort(key=lambda m: (-m[0], -m[1], -m[2], m[3]))
    return [(left, right) for *_, left, right in ranked]


def sentencepiece_tokenizer(arch: str, tokens: list[str], scores: list[float], unk: str | None):
    """A ``tokenizers.Tokenizer`` for the SentencePiece vocabulary of a file of architecture ``arch``
    (special tokens and BOS are added by the caller, ``gguf_tokenizer.build_tokenizer``).

    Args:
        arch: ``general.architecture``: the Gemma and Phi-3 files have their own ways with spaces.
        tokens: ``tokenizer.ggml.tokens``.
        scores: ``tokenizer.ggml.scores``.
        unk: the unknown piece, or None.
    """
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers

    gemma = arch in _GEMMA
    if gemma:  # pieces of spaces only are stored as spaces: spell them as the text will be (▁▁...)
        tokens = [SPACE * len(t) if " " in t and not t.strip() else t for t in tokens]
        scores = [-float(i) for i in range(len(tokens))]  # the file's order is the merge order
    vocab = {}
    for i, token in enumerate(tokens):
        vocab.setdefault(token, i)
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges_from_vocabulary(tokens, scores), unk_token=unk,
                                     fuse_unk=True, byte_fallback=True))
    undo = [decoders.Replace(SPACE, " "), decoders.ByteFallback(), decoders.Fuse()]
    if gemma:
        tokenizer.normalizer = normalizers.Replace(" ", SPACE)
        tokenizer.pre_tokenizer = pre_tokenizers.Split(" ", behavior="merged_with_previous")
        tokenizer.decoder = decoders.Sequence(undo)
        return tokenizer, vocab
    if arch == "phi3":
        tokenizer.normalizer = normalizers.Sequence([normalizers.Prepend(SPACE), normalizers.Replace(" ", SPACE)])
    else:
        tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(replacement=SPACE, prepend_scheme="first", split=False)
    tokenizer.decoder = decoders.Sequence([*undo, decoders.Strip(" ", 1, 0)])
    return tokenizer, vocab
