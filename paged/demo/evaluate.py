"""Held-out loss of a demo-model folder: the number its model card records.

The held-out stream is every held-out document (see :mod:`paged.demo.corpus`) encoded as
``BOS text EOS`` and concatenated in sorted path order. It is cut into windows of
``seq_len + 1`` tokens with a stride of ``seq_len``, so each token after the first is a
target exactly once (windows overlap by the one token that starts the next). The loss is
the mean next-token cross-entropy in nats over all targets; perplexity is ``exp(loss)``.

``max_windows`` picks that many windows evenly spaced over the stream (a deterministic
subset, fast enough for a test); ``None`` uses all of them. The result carries a
fingerprint (sha256 of the windows' token ids) so a caller can tell whether it evaluated
the same tokens as the run that wrote the card (another Python version has other files).
"""

from __future__ import annotations

import ast
import hashlib
import math
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from paged.demo import corpus
from paged.demo.tokenizer import encode_document, load_tokenizer


@dataclass(frozen=True)
class HeldoutResult:
    """Mean cross-entropy (nats / token) over ``num_tokens`` targets in ``num_windows`` windows."""

    loss: float
    num_tokens: int
    num_windows: int
    fingerprint: str  # sha256 hex of the evaluated windows' token ids

    @property
    def perplexity(self) -> float:
        return math.exp(self.loss)


def heldout_windows(model_dir: Path, seq_len: int = 256, max_windows: int | None = None,
                    root: Path | None = None) -> torch.Tensor:
    """The held-out windows, ``[num_windows, seq_len + 1]`` int64.

    Raises:
        ValueError: ``seq_len`` or ``max_windows`` is not positive, or the held-out
            stream is shorter than one window.
    """
    if seq_len < 1:
        raise ValueError(f"seq_len must be positive, got {seq_len}")
    if max_windows is not None and max_windows < 1:
        raise ValueError(f"max_windows must be positive or None, got {max_windows}")
    tok = load_tokenizer(model_dir)
    stream: list[int] = []
    for _, text in corpus.documents("heldout", root):
        stream.extend(encode_document(tok, text))
    total = (len(stream) - 1) // seq_len
    if total < 1:
        raise ValueError(f"held-out stream has {len(stream)} tokens, fewer than one window of {seq_len + 1}")
    data = torch.tensor(stream, dtype=torch.int64)
    starts = torch.arange(total) * seq_len
    if max_windows is not None and max_windows < total:
        starts = starts[torch.linspace(0, total - 1, max_windows).round().long()]
    return torch.stack([data[s : s + seq_len + 1] for s in starts.tolist()])  # [W, seq_len + 1]


@torch.no_grad()
def model_loss(model: torch.nn.Module, windows: torch.Tensor, batch_size: int = 8) -> float:
    """Mean next-token cross-entropy of a causal LM over ``windows`` ``[W, T + 1]``."""
    total, count = 0.0, 0
    for i in range(0, windows.shape[0], batch_size):
        batch = windows[i : i + batch_size]
        logits = model(input_ids=batch[:, :-1]).logits  # [b, T, V]
        targets = batch[:, 1:]  # [b, T]
        total += F.cross_entropy(logits.flatten(0, 1).double(), targets.flatten(), reduction="sum").item()
        count += targets.numel()
    return total / count


def heldout_loss(model_dir: Path, seq_len: int = 256, max_windows: int | None = None,
                 batch_size: int = 8, root: Path | None = None) -> HeldoutResult:
    """Load ``model_dir`` with ``transformers`` in float32 and measure its held-out loss."""
    from transformers import AutoModelForCausalLM

    windows = heldout_windows(model_dir, seq_len, max_windows, root)
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    loss = model_loss(model, windows, batch_size)
    digest = hashlib.sha256(windows.numpy().tobytes()).hexdigest()
    return HeldoutResult(loss, windows.shape[0] * seq_len, windows.shape[0], digest)


# --- Does a completion parse? -------------------------------------------------------------
#
# The measure the docs and tests quote for "completes code better than chance": sample
# ``k`` completions of ``prompt`` at ``temperature`` (seeded, no top-k / top-p), trim each
# with :func:`trim_to_block`, and count how many ``ast.parse``; do the same for ``k``
# completions of uniformly random non-special tokens, each as long as the model's sample
# of the same index. The one-sided Fisher exact test says how surprising the difference is.

FIBONACCI_PROMPT = "def fibonacci(n):"


def trim_to_block(text: str, truncated: bool) -> str:
    """The prompt's top-level block: stop before the first later line that starts at column 0.

    ``text`` is prompt + completion. When the completion was cut by the token limit
    (``truncated``) and the block runs to the end of ``text``, its last line may be cut
    mid-way, so it is dropped. Blank lines are kept (they never end a block).
    """
    lines = text.split("\n")
    kept = lines[:1]
    for line in lines[1:]:
        if line.strip() and not line[0].isspace():
            break
        kept.append(line)
    else:
        if truncated and len(kept) > 1:
            kept.pop()
    return "\n".join(kept)


def parses(source: str) -> bool:
    """Whether ``source`` is syntactically valid Python."""
    try:
        ast.parse(source)
    except (SyntaxError, ValueError):  # ValueError: null bytes in the source
        return False
    return True


@dataclass(frozen=True)
class ParseRate:
    """Parsed completions out of ``k`` for the model and for random tokens, and Fisher's p."""

    k: int
    model_parsed: int
    random_parsed: int
    p_value: float  # one-sided: P(model >= observed | both rates equal)


def fisher_one_sided(a: int, b: int, n: int) -> float:
    """One-sided Fisher exact p-value that ``a``/``n`` successes exceed ``b``/``n``."""
    total = a + b
    return sum(math.comb(n, x) * math.comb(n, total - x) for x in range(a, min(n, total) + 1)) / math.comb(
        2 * n, total
    )


@torch.no_grad()
def parse_rate(model_dir: Path, prompt: str = FIBONACCI_PROMPT, k: int = 128, temperature: float = 0.8,
               max_new_tokens: int = 64, seed: int = 0) -> ParseRate:
    """Sample ``k`` completions of ``prompt`` from the model and ``k`` random ones; count parses."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    ids = torch.tensor([tok(prompt)["input_ids"]] * k)  # [k, P], starts with BOS
    torch.manual_seed(seed)
    out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=True, temperature=temperature,
                         top_k=0, top_p=1.0, max_new_tokens=max_new_tokens,
                         eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    gen = torch.Generator().manual_seed(seed)
    n_special = len(tok.all_special_ids)
    model_ok = random_ok = 0
    for row in out[:, ids.shape[1]:].tolist():
        eos_at = row.index(tok.eos_token_id) if tok.eos_token_id in row else None
        completion = row if eos_at is None else row[:eos_at]
        truncated = eos_at is None
        model_ok += parses(trim_to_block(prompt + tok.decode(completion), truncated))
        noise = torch.randint(n_special, len(tok), (len(completion),), generator=gen).tolist()
        random_ok += parses(trim_to_block(prompt + tok.decode(noise), truncated))
    return ParseRate(k, model_ok, random_ok, fisher_one_sided(model_ok, random_ok, k))


def main(argv: list[str] | None = None) -> None:
    """``python -m paged.demo.evaluate [--model DIR]``: held-out loss and the parse-rate measure."""
    import argparse

    from paged.demo import DEFAULT_MODEL_PATH

    p = argparse.ArgumentParser(prog="python -m paged.demo.evaluate", description=main.__doc__)
    p.add_argument("--model", type=Path, default=DEFAULT_MODEL_PATH)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    full = heldout_loss(args.model)
    print(f"held-out loss {full.loss:.6f} nats/token, perplexity {full.perplexity:.3f} ({full.num_tokens} tokens)")
    rate = parse_rate(args.model)
    print(f"{FIBONACCI_PROMPT!r}: {rate.model_parsed}/{rate.k} model completions parse, "
          f"{rate.random_parsed}/{rate.k} random ones; one-sided Fisher p = {rate.p_value:.2e}")


if __name__ == "__main__":
    main()
