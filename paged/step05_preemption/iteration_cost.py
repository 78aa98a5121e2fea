"""What an iteration costs on this machine, learnt from the iterations it ran: chunks cut to a time.

A token cap (``ChunkedPrefill``'s ``long_prefill_token_threshold``) keeps a long
prompt's chunks short in tokens, but a token's cost is not fixed: it runs
through every linear (the same work at any position) and attends to every key
before it (work that grows with its position). On a CPU whose attention is slow
a chunk of 128 tokens at position 4 000 takes seconds, while the same chunk at
position 0 takes a fraction of one; a request arriving beside it waits for that
chunk. So the chunk is also cut to a time: an iteration's seconds are modelled as

    seconds ~= a * tokens + b * pairs

where ``tokens`` are the query tokens it computes and ``pairs`` the query-key
pairs they attend (a token at position p attends p + 1 keys), and a chunk gets
the most tokens whose predicted seconds, with those of the other prompt chunks of
its iteration, fit in the target.
``a`` and ``b`` are a least-squares fit over the iterations run so far, older
ones weighing less (``decay`` per iteration), so the model follows the machine
(its CPU, its load) without being told. Before the first fit, only the token cap
applies.

Timing makes the chunk boundaries depend on the machine; what a request
computes does not change with them in batch-invariant mode (every token's bits
are the same in any chunk: tests/step05_preemption/test_batch_invariance.py).
"""

from __future__ import annotations

PAIRS_UNIT = 1000  # pairs are counted in thousands, so both features have similar sizes in the fit
MIN_CHUNK = 8  # a chunk is never cut below this many tokens (a prompt must advance)


def plan_work(query_lens, context_lens) -> tuple[int, int]:
    """``(tokens, pairs)`` of a plan's sequences: query lengths and their context lengths (new tokens
    included); the i-th of a sequence's q new tokens sits at position ctx - q + i and attends to that many
    keys plus one, so a sequence adds q tokens and q * ctx - q * (q - 1) / 2 pairs."""
    tokens = pairs = 0
    for q, ctx in zip(query_lens, context_lens):
        tokens += q
        pairs += q * ctx - q * (q - 1) // 2
    return tokens, pairs


def prefill_work(plan) -> tuple[int, int]:
    """``(tokens, pairs)`` of the prompt chunks a plan holds so far (sequences computing more than one
    token): the work a new chunk shares its seconds with. Decodes are left out."""
    chunks = [(q, ctx) for q, ctx in zip(plan.query_lens, plan.context_lens) if q > 1]
    return plan_work([q for q, _ in chunks], [ctx for _, ctx in chunks])


def chunk_pairs(start: int, n: int) -> int:
    """Query-key pairs of ``n`` tokens computed after ``start`` cached ones: (start + 1) + ... + (start + n)."""
    return n * start + n * (n + 1) // 2


# --8<-- [start:cost]
class IterationCost:
    """seconds ~= a * tokens + b * pairs, fitted to the iterations observed.

    Args:
        target_seconds: the seconds the prompt chunks of an iteration should take at most (> 0).
        decay: the weight each older iteration keeps per newer one (0 < decay <= 1).
    """

    def __init__(self, target_seconds: float, decay: float = 0.9) -> None:
        if isinstance(target_seconds, bool) or not isinstance(target_seconds, (int, float)) or not target_seconds > 0:
            raise ValueError(f"target_seconds must be a number of seconds > 0, got {target_seconds!r}")
        if not 0 < decay <= 1:
            raise ValueError(f"decay must be in (0, 1], got {decay!r}")
        self.target_seconds, self.decay = float(target_seconds), decay
        self.sxx = [[0.0, 0.0], [0.0, 0.0]]  # decayed sums of x x^T, x = (tokens, pairs / PAIRS_UNIT)
        self.sxy = [0.0, 0.0]  # decayed sums of x * seconds
        self.observed = 0  # iterations fitted
        self.a = self.b = None  # seconds per token, per PAIRS_UNIT pairs; None until the first fit

    def observe(self, tokens: int, pairs: int, seconds: float) -> None:
        """Fold one iteration's work and measured seconds into the fit (iterations without tokens are
        memory moves only, and teach nothing)."""
        if tokens <= 0 or not seconds >= 0:
            return
        x = (float(tokens), pairs / PAIRS_UNIT)
        for i in range(2):
            self.sxy[i] = self.decay * self.sxy[i] + x[i] * seconds
            for j in range(2):
                self.sxx[i][j] = self.decay * self.sxx[i][j] + x[i] * x[j]
        self.observed += 1
        self.a, self.b = self._solve()

    def _solve(self) -> tuple[float, float]:
        """Least squares with a small ridge (one iteration, or iterations of one shape, leave the split
        between a and b open: the ridge takes the smallest), neither coefficient below zero."""
        (p, q), (_, r) = self.sxx
        u, v = self.sxy
        ridge = 1e-9 * (p + r) + 1e-12
        p, r = p + ridge, r + ridge
        det = p * r - q * q
        a, b = (r * u - q * v) / det, (p * v - q * u) / det
        if a < 0:  # the best fit with a = 0
            a, b = 0.0, max(0.0, v / r)
        elif b < 0:
            a, b = max(0.0, u / p), 0.0
        return a, b

    def predict(self, tokens: int, pairs: int) -> float | None:
        """Predicted seconds of an iteration of this work; None before the first fit."""
        if self.a is None:
            return None
        return self.a * tokens + self.b * pairs / PAIRS_UNIT

    def most_tokens(self, start: int, limit: int, beside: tuple[int, int] = (0, 0)) -> int:
        """The most of ``limit`` tokens, after ``start`` cached ones, that a chunk can compute while the
        prompt chunks of its iteration (``beside``: their tokens and pairs, ``prefill_work``) stay within
        the target together. Decodes are not counted: they are never cut for a chunk, and must not
        starve it when they alone fill the target (a busy server). At least ``MIN_CHUNK`` (or ``limit``
        if smaller), so a prompt always advances; ``limit`` before the first fit. The predicted seconds
        grow with the chunk, so the answer is found by bisection."""
        if self.a is None or limit <= MIN_CHUNK:
            return limit

        def fits(n: int) -> bool:
            return self.predict(beside[0] + n, beside[1] + chunk_pairs(start, n)) <= self.target_seconds

        if fits(limit):
            return limit
        lo, hi = MIN_CHUNK, limit  # the answer is in [lo, hi): fits(hi) is False
        if not fits(lo):
            return MIN_CHUNK
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if fits(mid) else (lo, mid)
        return lo
# --8<-- [end:cost]
