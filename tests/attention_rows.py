"""Which rows of a packed attention output are wrong: decode rows, prompt rows, which sequence.

A packed batch holds, per sequence, ``query_len`` consecutive rows: one row for a decoding
sequence (its newest token, which sees every key), several for a prompt or a prompt chunk
(causal: the query at position ``p`` sees keys ``0 .. p``). A bug often breaks one kind
only — a missing causal mask leaves every decode row right and every prompt row past the
first wrong — so ``assert_rows_close`` says, in words, which kind of row and which
sequences differ, instead of one flat index into the packed tensor.
"""

from __future__ import annotations

import torch


def _kind(context_len: int, query_len: int) -> str:
    if query_len == 1:
        return "decode row"
    if query_len == context_len:
        return "prompt rows"
    return "prompt-chunk rows"


def assert_rows_close(out: torch.Tensor, expected: torch.Tensor, context_lens: list[int], query_lens: list[int],
                      rtol: float, atol: float, what: str = "the output") -> None:
    """``out`` equals ``expected`` within ``rtol``/``atol`` (``torch.isclose``), or an AssertionError
    naming the wrong rows.

    Args:
        out, expected: ``[T, H, D]``, ``T = sum(query_lens)``, sequences one after the other.
        context_lens: keys each sequence's last query sees (its tokens so far).
        query_lens: rows of each sequence.
        rtol, atol: the tolerance (a named constant of ``tests/tolerances.py``).
        what: what ``out`` is, for the message.
    """
    assert out.shape == expected.shape, f"{what} has shape {tuple(out.shape)}; it must be {tuple(expected.shape)}"
    close = torch.isclose(out, expected, rtol=rtol, atol=atol).flatten(1).all(dim=1)  # [T]
    if bool(close.all()):
        return
    wrong, right, start = [], [], 0
    worst = (0.0, "")
    for s, (c, q) in enumerate(zip(context_lens, query_lens)):
        rows = close[start:start + q]
        kind = _kind(c, q)
        seen = f"sequence {s} ({kind}: {q} quer{'y' if q == 1 else 'ies'} over {c} key{'' if c == 1 else 's'})"
        if bool(rows.all()):
            right.append(seen)
        else:
            bad = [c - q + i for i in range(q) if not bool(rows[i])]  # positions of the wrong queries
            wrong.append(f"{seen}: wrong at position{'s' if len(bad) > 1 else ''} {_spans(bad)}")
            diff = (out[start:start + q] - expected[start:start + q]).abs().max().item()
            if diff > worst[0]:
                worst = (diff, f"sequence {s}")
        start += q
    lines = [f"{what} must equal contiguous attention (SDPA over the same keys and values) within "
             f"rtol {rtol:g}, atol {atol:g}, row by row:"]
    lines += [f"  wrong: {w}" for w in wrong]
    lines += [f"  right: {r}" for r in right]
    lines.append(f"  largest difference {worst[0]:.3g}, in {worst[1]}")
    if wrong and all("decode row:" not in w for w in wrong) and any("decode row:" in r for r in right):
        lines.append("  only prompt rows are wrong: the query at position p must not see keys after p (causal)")
    raise AssertionError("\n".join(lines))


def _spans(positions: list[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``"0..2, 5"``."""
    out, i = [], 0
    while i < len(positions):
        j = i
        while j + 1 < len(positions) and positions[j + 1] == positions[j] + 1:
            j += 1
        out.append(str(positions[i]) if i == j else f"{positions[i]}..{positions[j]}")
        i = j + 1
    return ", ".join(out)
