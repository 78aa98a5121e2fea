"""Figures 8, 9 and 10 of the paper, drawn from real block tables (paper §4.4).

* **Figure 8** (parallel sampling): two samples fork from one 7-token prompt
  (``B = 4``); both map physical blocks 7 and 1, reference count 2. Sample A1
  writes *fathers* into the shared, partly filled block 1: copy-on-write gives
  it block 3 (a ``(1, 3)`` copy); A2 then writes *mothers* into block 1 in
  place, its count being 1 again. Run through a ``SharingKVManager``'s tables whose free
  list hands out 7, 1, 3 as in the paper.
* **Figure 9** (beam search): a real ``SharingEngine`` runs beam search
  (``k = 4``, ``B = 4``) on the demo model, tokens drawn as their text; an engine observer reads
  the tables of the live candidates after every iteration, and the figure
  shows the first beam update that drops a candidate and the iteration
  before it.
* **Figure 10** (shared prefix): two translation requests with the same
  few-shot prefix; the second request's prompt finds the prefix's full blocks
  in the prefix cache and maps them (reference count 2); only its own task is
  computed. When both finish, the prefix blocks stay cached on the free list.

What a block holds is read from the tables that map it (the tokens of that
logical block); the stateful tests prove it is what the KV cache holds.

Regenerate the docs figures with::

    python -m paged.step04_sharing.diagram docs/figures

Extends: nothing; it reads ``CowBlockTable.blocks`` / ``num_tokens``, the
allocator's reference counts and the plan's ``blocks_to_copy``.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

from paged.step04_sharing.kv_manager import SharingKVManager
from paged.step04_sharing.cow_table import CowBlockTable


@dataclass
class Snapshot:
    """Block tables and the pool at one moment."""

    title: str
    block_size: int
    tables: list[tuple[str, list[int], int, list[str]]]  # name, blocks, tokens with a slot, words
    ref_counts: dict[int, int]  # used block -> reference count
    free: list[int]  # free blocks, allocation order
    cached_free: list[int] = field(default_factory=list)  # free but still findable (LRU, oldest first)
    copies: list[tuple[int, int]] = field(default_factory=list)  # copy-on-write (src, dst) this iteration
    note: str = ""
    # blocks no table maps any more that the picture still draws (a copy's source or destination freed in the
    # same iteration, a cached prefix block after its requests ended): block -> the tokens it holds
    unmapped: dict[int, list[str]] = field(default_factory=dict)


def snapshot(title: str, named: list[tuple[str, CowBlockTable, list[str]]], allocator, block_size: int,
             copies=(), note: str = "") -> Snapshot:
    """Read ``(name, table, words)`` and the allocator's counts into a ``Snapshot``."""
    used = [b for b in range(allocator.num_blocks) if allocator.ref_count(b) > 0]
    free = allocator.free_blocks()
    lru = list(getattr(allocator, "_lru", ()))
    return Snapshot(title, block_size, [(n, list(t.blocks), t.num_tokens, list(w)) for n, t, w in named],
                    {b: allocator.ref_count(b) for b in used}, [b for b in free if b not in lru], lru,
                    list(copies), note)


# --8<-- [start:render]
def render_text(snap: Snapshot) -> str:
    """Each table (logical -> physical, #filled), then every used block with its count and mappers."""
    b = snap.block_size
    lines = [snap.title, ""]
    mapped: dict[int, list[tuple[str, int, list[str]]]] = {}
    for name, blocks, n, words in snap.tables:
        filled = [min(b, n - i * b) for i in range(len(blocks))]
        lines.append(f"{name:<14} blocks {str(blocks):<22} #filled {filled}")
        for i, block in enumerate(blocks):
            mapped.setdefault(block, []).append((name, i, words[i * b: i * b + filled[i]]))
    width = max([len(w) for _, _, _, words in snap.tables for w in words]
                + [len(w) for words in snap.unmapped.values() for w in words], default=1)
    if snap.ref_counts or snap.unmapped:
        lines += ["", f"physical block │ {'tokens':<{(width + 3) * b - 3}} │ ref │ mapped by (logical block)"]
    for block in sorted(snap.ref_counts):  # used blocks only
        cells = mapped[block][0][2] if block in mapped else []
        row = " │ ".join(f"{c:<{width}}" for c in cells + ["·"] * (b - len(cells)))
        who = ", ".join(f"{name} ({i})" for name, i, _ in mapped.get(block, []))
        lines.append(f"      block {block:>2} │ {row} │ {snap.ref_counts[block]:>3} │ {who}")
    for block in sorted(set(snap.unmapped) - set(snap.ref_counts)):  # free, but the picture draws it
        cells = snap.unmapped[block]
        row = " │ ".join(f"{c:<{width}}" for c in cells + ["·"] * (b - len(cells)))
        why = "free, findable in the prefix cache" if block in snap.cached_free else "free again (candidate dropped)"
        lines.append(f"      block {block:>2} │ {row} │ {0:>3} │ {why}")
    free = snap.free if len(snap.free) <= 12 else f"{len(snap.free)} blocks"
    lines.append(f"free blocks: {free}")
    if snap.cached_free:
        lines.append(f"free but cached (evicted least recently used first): {snap.cached_free}")
    if snap.copies:
        lines.append("copy-on-write this iteration (src -> dst): "
                     + ", ".join(f"{s} -> {d}" for s, d in snap.copies))
    if snap.note:
        lines.append(snap.note)
    return "\n".join(lines) + "\n"
# --8<-- [end:render]


def _vocab(words: list[str]) -> tuple[list[int], list[str]]:
    table = {w: i for i, w in enumerate(dict.fromkeys(words))}
    return [table[w] for w in words], list(table)


# --8<-- [start:figure8]
FIG8_PROMPT = "Four score and seven years ago our".split()


def figure8() -> list[Snapshot]:
    """Parallel sampling: fork after the prompt, then copy-on-write of the shared last block."""
    bm = SharingKVManager(8, 4, enable_prefix_caching=False, free_order=[7, 1, 3, 0, 2, 4, 5, 6])
    a1 = bm.new_table()
    bm.allocate_prompt(a1, list(range(len(FIG8_PROMPT))))  # the prompt's K/V, computed once
    a2 = a1.fork()  # sample A2: a copy of the table, every block's count + 1
    words = list(FIG8_PROMPT)
    before = snapshot("Figure 8 · after the prompt: A2 = fork(A1)", [("Sample A1", a1, words),
                                                                    ("Sample A2", a2, words)], bm.allocator, 4)
    a1.append(1)  # A1's next token goes into block 1, shared and not full: copy-on-write
    a2.append(1)  # block 1 is now A2's alone: written in place
    copies = a1.take_copies() + a2.take_copies()  # the plan's blocks_to_copy, run before the forward pass
    after = snapshot("Figure 8 · A1 writes 'fathers', A2 writes 'mothers'",
                     [("Sample A1", a1, words + ["fathers"]), ("Sample A2", a2, words + ["mothers"])],
                     bm.allocator, 4, copies)
    return [before, after]
# --8<-- [end:figure8]


# --8<-- [start:figure10]
FIG10_PREFIX = "Translate English to French : sea otter => loutre de mer ;".split()  # 12 words: 3 blocks
FIG10_TASKS = {"Request A": "cheese =>".split(), "Request B": "I love you =>".split()}


def figure10() -> list[Snapshot]:
    """Two requests with one few-shot prefix: the second maps the cached prefix blocks."""
    prompts = {name: FIG10_PREFIX + task for name, task in FIG10_TASKS.items()}
    ids, _ = _vocab([w for p in prompts.values() for w in p])
    bm = SharingKVManager(12, 4, enable_prefix_caching=True, free_order=[3, 8, 5, 1, 10, 0, 6, 2, 4, 7, 9, 11])
    tables, notes, start = {}, [], 0
    for name, words in prompts.items():
        prompt = ids[start:start + len(words)]
        start += len(words)
        table = tables[name] = bm.new_table()
        cached, _ = bm.allocate_prompt(table, prompt)
        bm.register_full_blocks(table, prompt)  # after its forward pass: full blocks become findable
        notes.append(f"{name}: {len(prompt)} prompt tokens, {cached} found in the cache, "
                     f"{len(prompt) - cached} computed")
    named = [(n, tables[n], prompts[n]) for n in prompts]
    both = snapshot("Figure 10 · two requests sharing a cached prefix", named, bm.allocator, 4,
                    note="\n".join(notes))
    words = {block: prompts[name][i * 4:(i + 1) * 4] for name, t in tables.items() for i, block in enumerate(t.blocks)}
    for t in tables.values():
        t.free()
    done = snapshot("Figure 10 · both requests finished", [], bm.allocator, 4,
                    note="the prefix blocks wait on the free list, findable, until the pool needs them")
    done.unmapped = {block: words[block] for block in done.cached_free}
    return [both, done]
# --8<-- [end:figure10]


# --8<-- [start:figure9]
def figure9(model, k: int = 4, prompt_len: int = 6, max_tokens: int = 16, prompt: list[int] | None = None,
            word=None) -> list[Snapshot]:
    """Beam search in a real ``SharingEngine``: the tables before and after a beam update that drops one.

    The first such update is chosen where the candidates already form a tree
    (some block is shared by more than one candidate but not by all). ``prompt`` (token ids; default
    ``prompt_len`` ids of a fixed pattern) is what the candidates extend; ``word(token id)`` labels a
    token in the picture (default ``t<id>``). A copy whose source or destination is free again after the
    beam update (its candidate was dropped) is kept in ``unmapped``, so the picture can draw it.
    """
    word = word or (lambda t: f"t{t}")
    from paged.step04_sharing import SamplingParams, SharingEngine

    engine = SharingEngine(model, block_size=4, num_blocks=32, enable_prefix_caching=False,
                           attention_backend="reference", free_order=list(range(32)))
    if prompt is None:
        prompt = [3 + 7 * i % (model.config.vocab_size - 3) for i in range(prompt_len)]
    engine.add_request("beam", prompt, SamplingParams(use_beam_search=True, n=k, temperature=0.0,
                                                      max_tokens=max_tokens, ignore_eos=True))
    seen = []

    def observe(engine, plan, results):  # after the iteration's beam update
        if not engine.scheduler.running:
            return
        live = [s for s in engine.scheduler.running[0].seqs if not s.is_finished]
        named = [(f"candidate {s.seq_id}", s.block_table, [word(t) for t in s.token_ids]) for s in live]
        seen.append((set(s.seq_id for s in live), snapshot(
            f"Figure 9 · beam search (k = {k}), after iteration {len(seen) + 1}", named, engine.scheduler.kv.allocator, 4,
            plan.blocks_to_copy)))

    engine.add_observer(observe)
    while engine.has_unfinished():
        engine.step()
    engine.remove_observer(observe)
    for i, ((ids_before, before), (ids_after, after)) in enumerate(zip(seen, seen[1:])):
        tree = any(1 < c < k for c in before.ref_counts.values())  # a block shared by some candidates
        if tree and len(ids_before) == k and ids_before - ids_after and ids_after - ids_before:
            dropped = sorted(ids_before - ids_after)
            before.unmapped = _copied_but_free(before, seen[i - 1][1] if i else None)
            after.unmapped = _copied_but_free(after, before)
            after.note = (f"dropped since the last iteration: {', '.join(f'candidate {i}' for i in dropped)} "
                          f"(their blocks' counts went down; blocks at 0 are free again); new candidates "
                          f"{', '.join(str(i) for i in sorted(ids_after - ids_before))} are forks")
            return [before, after]
    raise RuntimeError("no beam update dropped a candidate of a branching tree; use more max_tokens")
# --8<-- [end:figure9]


def _copied_but_free(snap: Snapshot, prior: Snapshot | None) -> dict[int, list[str]]:
    """The blocks of ``snap``'s copies that no table maps any more (a dropped candidate's copy, a source left
    by every writer), with their tokens as the ``prior`` snapshot saw them (a copy: its source's)."""
    held = {}
    for _, blocks, n, words in (prior.tables if prior else []):
        for i, block in enumerate(blocks):
            held.setdefault(block, words[i * snap.block_size:min(n, (i + 1) * snap.block_size)])
    out = {}
    for src, dst in snap.copies:
        for block in (src, dst):
            if block not in snap.ref_counts:
                out[block] = held.get(block, held.get(src, []))
    return out


def _names(items) -> str:
    items = list(items)
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def explain_figure9(before: Snapshot, after: Snapshot) -> str:
    """The paragraph under Figure 9, written from the two snapshots it explains (so it cannot drift)."""
    was = {name: blocks for name, blocks, _, _ in before.tables}
    now = {name: blocks for name, blocks, _, _ in after.tables}
    dropped, new = [n for n in was if n not in now], [n for n in now if n not in was]
    freed = sorted(b for b in before.ref_counts if b not in after.ref_counts)
    s_ = lambda n: "" if n == 1 else "s"  # noqa: E731
    text = [f"Between the two iterations, {_names(dropped)} {'was' if len(dropped) == 1 else 'were'} not "
            f"among the best extensions and {'was' if len(dropped) == 1 else 'were'} dropped"]
    text[-1] += (f": block{s_(len(freed))} {_names([str(b) for b in freed])}, which only "
                 f"{'it' if len(dropped) == 1 else 'they'} mapped, {'is' if len(freed) == 1 else 'are'} "
                 "free again." if freed else f"; every block {'it' if len(dropped) == 1 else 'they'} mapped is still "
                 "mapped by another candidate.")
    if new:
        text.append(f"{_names(new).capitalize()} {'is a fork' if len(new) == 1 else 'are forks'} of a "
                    "candidate chosen more than once, mapping its blocks.")
    by_src: dict[int, list[int]] = {}
    for src, dst in after.copies:
        by_src.setdefault(src, []).append(dst)
    for src, dsts in by_src.items():
        times = {1: "once", 2: "twice"}.get(len(dsts), f"{len(dsts)} times")
        text.append(f"Writing the new tokens found block {src}, partly filled, shared by "
                    f"{before.ref_counts.get(src, 0)} candidates, so it was copied {times} "
                    f"({', '.join(f'{src} → {d}' for d in dsts)}), and the last writer kept it.")
    return " ".join(text) + "\n"


FIG9_PROMPT = "def fib(n):"


def figure9_demo() -> list[Snapshot]:
    """Figure 9 as the docs show it: beam search on the bundled demo model (a small code model), its
    prompt ``FIG9_PROMPT``, every token drawn as the text it decodes to (a space as ␣)."""
    import torch

    from paged.models import load_model
    from paged.models.default import DEFAULT_MODEL_PATH

    model = load_model(DEFAULT_MODEL_PATH, dtype=torch.float32)
    tok = model.tokenizer
    word = lambda t: tok.decode([t]).replace(" ", "␣").replace("\n", "⏎") or "‹s›"  # noqa: E731
    return figure9(model, prompt=tok.encode(FIG9_PROMPT).ids, word=word)


def main(out_dir: str = "docs/figures") -> int:
    """Write ``step04_figure8/9/10.txt`` and Figure 9's paragraph into ``out_dir`` (Figure 9 runs the demo model)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for name, snaps in [("figure8", figure8()), ("figure9", figure9_demo()), ("figure10", figure10())]:
        (out / f"step04_{name}.txt").write_text("\n".join(render_text(s) for s in snaps))
        print(f"wrote {out / f'step04_{name}.txt'}")
        if name == "figure9":  # the page's paragraph under the figure, from the same run
            (out / "step04_figure9_text.md").write_text(explain_figure9(*snaps))
            print(f"wrote {out / 'step04_figure9_text.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
