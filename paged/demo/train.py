"""Train the demo model: ``python -m paged.demo.train --out DIR --minutes M --seed S``.

A plain PyTorch loop, deliberately short to read:

1. train the byte-level BPE (:mod:`paged.demo.tokenizer`) on the training split,
2. encode every training file as ``BOS text EOS`` into one token stream,
3. build ``transformers.LlamaForCausalLM`` from a ``LlamaConfig`` (grouped-query
   attention, tied embeddings), so the output folder is an exact Hugging Face checkpoint,
4. AdamW on random windows of the stream (drawn with a seeded ``torch.Generator``),
   linear warm-up then cosine decay to ``lr / 10``, gradient clipping at 1.0,
5. save the folder, measure the held-out loss with :func:`paged.demo.evaluate.heldout_loss`
   and write the model card (``README.md``) and the loss log (``training_log.csv``).

Schedule and stopping: with ``--max-steps`` the cosine runs over steps and the run is
reproducible step for step (same seed, same thread count). With only ``--minutes`` the
cosine runs over wall-clock time and training stops when the budget is spent, so how many
steps fit depends on the machine; the card records the steps and tokens actually done.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import platform
import shlex
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm import tqdm

from paged.demo import corpus
from paged.demo.evaluate import heldout_loss
from paged.demo.tokenizer import BOS, EOS, PAD, encode_document, save_tokenizer, train_tokenizer

TEST_SUBSET_WINDOWS = 16
"""Windows in the held-out subset that ``tests/models/test_demo_model.py`` re-evaluates."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m paged.demo.train", description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, required=True, help="output folder (Hugging Face format)")
    p.add_argument("--minutes", type=float, default=35.0, help="wall-clock budget of the training loop")
    p.add_argument("--max-steps", type=int, default=None, help="stop after this many steps (step-based schedule)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1, help="torch.set_num_threads")
    p.add_argument("--vocab-size", type=int, default=4096)
    p.add_argument("--hidden-size", type=int, default=256)
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--intermediate-size", type=int, default=688)
    p.add_argument("--max-position-embeddings", type=int, default=1024)
    p.add_argument("--seq-len", type=int, default=256, help="training window length")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--warmup-steps", type=int, default=50)
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--log-every", type=int, default=10)
    p.add_argument("--max-train-files", type=int, default=None,
                   help="train on the first N training files only (quick trial runs)")
    p.add_argument("--eval-windows", type=int, default=None,
                   help="held-out windows to evaluate for the card (default: all)")
    args = p.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # for the card's command line
    if args.minutes <= 0 and args.max_steps is None:
        p.error("give a positive --minutes or a --max-steps")
    if args.heads % args.kv_heads or args.hidden_size % args.heads:
        p.error("--heads must divide --hidden-size and be a multiple of --kv-heads")
    if args.seq_len > args.max_position_embeddings:
        p.error("--seq-len must not exceed --max-position-embeddings")
    return args


def build_model(args: argparse.Namespace, tok):
    """A randomly initialised ``LlamaForCausalLM`` of the requested size."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=tok.get_vocab_size(),
        hidden_size=args.hidden_size,
        intermediate_size=args.intermediate_size,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads,
        max_position_embeddings=args.max_position_embeddings,
        rope_theta=10000.0,
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
        bos_token_id=tok.token_to_id(BOS),
        eos_token_id=tok.token_to_id(EOS),
        pad_token_id=tok.token_to_id(PAD),
    )
    model = LlamaForCausalLM(config)
    model.generation_config.bos_token_id = config.bos_token_id
    model.generation_config.eos_token_id = config.eos_token_id
    model.generation_config.pad_token_id = config.pad_token_id
    return model


def add_legacy_config_keys(path: Path) -> None:
    """Also write ``rope_theta`` and ``torch_dtype`` at the top level of ``config.json``.

    transformers 5 nests RoPE under ``rope_parameters`` and says ``dtype``; loaders
    written for the older layout (transformers 4, most published LLaMA checkpoints)
    read the flat keys. Writing both keeps the folder readable by either.
    """
    config = json.loads(path.read_text())
    config.setdefault("rope_theta", config.get("rope_parameters", {}).get("rope_theta", 10000.0))
    config.setdefault("torch_dtype", config.get("dtype", "float32"))
    path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def lr_at(progress: float, step: int, args: argparse.Namespace) -> float:
    """Linear warm-up over ``warmup_steps``, then cosine from ``lr`` to ``lr / 10``."""
    if step < args.warmup_steps:
        return args.lr * (step + 1) / args.warmup_steps
    return args.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0))))


def train(args: argparse.Namespace) -> dict:
    """Run the whole recipe; returns the figures written into the model card."""
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    started = time.time()
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)

    texts = [text for _, text in corpus.documents("train")][: args.max_train_files]
    tok = train_tokenizer(texts, args.vocab_size)
    stream = torch.tensor([i for t in texts for i in encode_document(tok, t)], dtype=torch.int64)
    print(f"corpus: {len(texts)} training files, {stream.numel()} tokens", flush=True)

    model = build_model(args, tok)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"model: {n_params} parameters", flush=True)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": args.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=args.lr, betas=(0.9, 0.95),
    )
    gen = torch.Generator().manual_seed(args.seed)
    budget_s = args.minutes * 60.0
    log_rows, window, step, t0 = [], [], 0, time.time()
    bar = tqdm(total=args.max_steps, desc="train", unit="step")
    model.train()
    while True:
        elapsed = time.time() - t0
        if args.max_steps is not None:
            if step >= args.max_steps:
                break
            progress = step / args.max_steps
        else:
            progress = elapsed / budget_s
        if args.minutes > 0 and elapsed >= budget_s:
            break
        lr = lr_at(progress, step, args)
        for group in opt.param_groups:
            group["lr"] = lr
        starts = torch.randint(0, stream.numel() - args.seq_len - 1, (args.batch_size,), generator=gen)
        batch = torch.stack([stream[s : s + args.seq_len + 1] for s in starts.tolist()])  # [batch, T + 1]
        logits = model(input_ids=batch[:, :-1]).logits  # [batch, T, V]
        loss = F.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        window.append(loss.item())
        bar.update(1)
        bar.set_postfix(loss=f"{loss.item():.3f}", lr=f"{lr:.2e}")
        if step % args.log_every == 0:
            row = dict(step=step, elapsed_s=round(time.time() - t0, 1), tokens=step * args.batch_size * args.seq_len,
                       lr=f"{lr:.3e}", loss=round(sum(window) / len(window), 4))
            log_rows.append(row)
            window = []
            tqdm.write(json.dumps(row))
    bar.close()
    train_s = time.time() - t0
    model.eval()

    model.save_pretrained(str(out), safe_serialization=True)
    add_legacy_config_keys(out / "config.json")
    save_tokenizer(tok, out, args.max_position_embeddings)
    with open(out / "training_log.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=["step", "elapsed_s", "tokens", "lr", "loss"])
        writer.writeheader()
        writer.writerows(log_rows)

    full = heldout_loss(out, seq_len=args.seq_len, max_windows=args.eval_windows)
    subset = heldout_loss(out, seq_len=args.seq_len, max_windows=TEST_SUBSET_WINDOWS)
    figures = dict(
        parameters=n_params, steps=step, tokens_seen=step * args.batch_size * args.seq_len,
        train_tokens=stream.numel(), train_files=len(texts),
        heldout_files=len(corpus.list_files("heldout")),
        train_minutes=round(train_s / 60, 2), total_minutes=round((time.time() - started) / 60, 2),
        final_train_loss=log_rows[-1]["loss"] if log_rows else float("nan"),
        heldout_loss=full.loss, heldout_ppl=full.perplexity, heldout_tokens=full.num_tokens,
        subset_loss=subset.loss, subset_windows=subset.num_windows, subset_fingerprint=subset.fingerprint,
    )
    write_card(out, args, figures)
    print(json.dumps(figures), flush=True)
    return figures


def write_card(out: Path, args: argparse.Namespace, f: dict) -> None:
    """The model card: corpus, split, command, parameters, time, held-out figures, limits."""
    command = "python -m paged.demo.train " + shlex.join(args.argv)
    schedule = "the wall-clock budget" if args.max_steps is None else f"{args.max_steps} steps"
    card = f"""---
license: psf-2.0
library_name: transformers
pipeline_tag: text-generation
tags: [llama, code, paged-demo]
---

# paged demo model: a tiny Python code-completion LLaMA

Trained by `paged` itself (`paged/demo/train.py`) so that `paged` works with no download.
It completes Python code in the style of the standard library. It is a teaching toy of
{f['parameters'] / 1e6:.1f} M parameters: expect plausible-looking, often syntactically valid, rarely correct code.

## Corpus and split

- The `*.py` files of the CPython {platform.python_version()} standard library
  (`sysconfig.get_paths()["stdlib"]`), without test suites, site-packages, IDLE,
  turtledemo, encodings, ensurepip and pydoc_data (`paged/demo/corpus.py`).
- Split by file: a file is held out when `int(sha256(relative path)[:8 bytes]) % 20 == 0`.
  {f['train_files']} training files ({f['train_tokens']} tokens), {f['heldout_files']} held-out files.
- Tokenizer: byte-level BPE, {args.vocab_size} tokens, trained on the training split;
  specials `<|bos|>` (0), `<|eos|>` (1), `<|pad|>` (2); encoding prepends `<|bos|>`;
  each document is `<|bos|> file <|eos|>`.

## Model

LLaMA (`LlamaForCausalLM`): hidden {args.hidden_size}, {args.layers} layers, {args.heads} query heads /
{args.kv_heads} KV heads (grouped-query attention), MLP {args.intermediate_size}, RoPE θ 10000,
context {args.max_position_embeddings} (trained on windows of {args.seq_len}), tied embeddings,
float32 weights, {f['parameters']} parameters.

## Training

```
{command}
```

AdamW (β 0.9 / 0.95, weight decay {args.weight_decay} on matrices), peak learning rate {args.lr},
{args.warmup_steps} warm-up steps then cosine to a tenth over {schedule}, batch
{args.batch_size} × {args.seq_len} tokens, gradient clipping 1.0, seed {args.seed},
{args.threads} CPU thread(s) ({platform.processor() or platform.machine()}), torch {torch.__version__}.
Loss log: `training_log.csv`.

## Results

| figure | value |
|---|---|
| parameters | {f['parameters']} |
| training steps | {f['steps']} |
| tokens seen | {f['tokens_seen']} |
| training time (loop) | {f['train_minutes']} min |
| whole run (tokenizer, training, evaluation) | {f['total_minutes']} min |
| final training loss (last {args.log_every} steps) | {f['final_train_loss']} |
| held-out loss | {f['heldout_loss']:.6f} nats/token |
| held-out perplexity | {f['heldout_ppl']:.3f} |
| held-out tokens evaluated | {f['heldout_tokens']} |
| test subset loss | {f['subset_loss']:.6f} nats/token |
| test subset windows | {f['subset_windows']} |
| test subset fingerprint | {f['subset_fingerprint']} |

Held-out loss: `paged.demo.evaluate.heldout_loss(folder)`, the mean next-token
cross-entropy over every held-out token (windows of {args.seq_len}, float32). The test
subset is `heldout_loss(folder, max_windows={TEST_SUBSET_WINDOWS})`, re-checked by
`tests/models/test_demo_model.py` when the local standard library gives the same tokens
(same fingerprint).

## Limits

- Tiny and briefly trained: it knows Python's surface syntax and the stdlib's idioms,
  not algorithms; completions are often wrong and sometimes do not parse.
- Trained on windows of {args.seq_len} tokens: quality falls beyond that, although the
  configuration allows {args.max_position_embeddings} positions.
- Only Python, only the standard library's style; no instructions, no chat.
"""
    (out / "README.md").write_text(card)


def main(argv: list[str] | None = None) -> None:
    train(parse_args(argv))


if __name__ == "__main__":
    main()
