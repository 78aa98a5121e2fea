"""The KV picture as static HTML, for notebooks: ``engine._repr_html_()`` draws ``take_snapshot(engine)``.

One square per cell of each pool: light grey when free, striped when parked
in the prefix cache, else the colour of the request that owns it — lighter when
nearly empty, darker when full — with a black inner frame when a block in it is
shared (reference count > 1). Hover a square for its numbers. Below: the
Figure 2 bar (slots holding token states / internal fragmentation / free,
the numbers of ``engine.stats()``) and each queue's requests with their block
tables (logical -> physical, ``#filled``).

The server's live page (``paged/serve/static/kv.html``) draws the same
snapshot with the same colours; ``owner_colour`` and ``cell_style`` are the
rules both follow. Plain HTML and inline CSS: no script, so it renders in any
notebook viewer and in the docs.

Extends: nothing; it reads the dict of ``paged.step04_sharing.snapshot``.
"""

from __future__ import annotations

from html import escape

FREE = "#e8e8e8"
PARKED = "repeating-linear-gradient(45deg, #cfe3d4 0 2px, #f4f4f4 2px 4px)"
SHARED_FRAME = "inset 0 0 0 2px #111"
FIG2 = (("token_slots_filled", "token states", "#3b7dd8"),
        ("internal_fragmentation_slots", "internal fragmentation", "#e8a33d"),
        ("free_slots", "free", "#d0d0d0"))


def owner_colour(arrival: int, fill: float) -> str:
    """A request's colour: a hue from its arrival number (golden angle apart), darker as it fills."""
    return f"hsl({arrival * 137.508 % 360:.0f}, 65%, {88 - 43 * fill:.0f}%)"


def cell_style(pool: dict, requests: list[dict], c: int) -> tuple[str, str]:
    """``(CSS background, CSS box-shadow)`` of cell ``c`` of ``pool``."""
    per = pool["blocks_per_cell"]
    count = min(per, pool["num_blocks"] - c * per)
    if pool["used"][c]:
        owner = pool["owner"][c]
        arrival = requests[owner]["arrival"] if owner >= 0 else 0
        fill = pool["filled"][c] / (count * pool["block_size"])
        background = owner_colour(arrival, fill) if owner >= 0 else "#888"
    else:
        background = PARKED if pool["parked"][c] else FREE
    return background, SHARED_FRAME if pool["shared"][c] else "none"


def _cell_title(pool: dict, requests: list[dict], c: int) -> str:
    per = pool["blocks_per_cell"]
    first, count = c * per, min(per, pool["num_blocks"] - c * per)
    where = f"block {first}" if count == 1 else f"blocks {first}-{first + count - 1}"
    owner = pool["owner"][c]
    who = requests[owner]["id"] if owner >= 0 else "-"
    return (f"{where}: owner {who}, {pool['used'][c]} used, {pool['shared'][c]} shared, "
            f"{pool['parked'][c]} parked, {pool['filled'][c]}/{count * pool['block_size']} slots filled")


LABELLED_CELLS = 64  # a pool of at most this many cells (a notebook's) draws large squares, numbered


def pool_html(name: str, pool: dict, requests: list[dict]) -> str:
    """One pool as a wrapping row of squares, with its heading.

    A small pool (at most ``LABELLED_CELLS`` cells, one block each) draws 28 px squares with the
    block number in each, so a table's ``logical -> physical`` entries can be found by eye; a
    larger one draws 14 px squares, numbers in the hover text only.
    """
    per = pool["blocks_per_cell"]
    labelled = per == 1 and len(pool["used"]) <= LABELLED_CELLS
    size = 28 if labelled else 14
    cells = []
    for c in range(len(pool["used"])):
        background, frame = cell_style(pool, requests, c)
        label = (f'<span style="font:11px/28px sans-serif;color:#111;text-shadow:0 0 2px #fff">{c}</span>'
                 if labelled else "")
        cells.append(f'<span title="{escape(_cell_title(pool, requests, c))}" style="display:inline-block;'
                     f'width:{size}px;height:{size}px;margin:1px;text-align:center;vertical-align:top;'
                     f'background:{background};box-shadow:{frame}">{label}</span>')
    scale = "one block per cell" if per == 1 else f"{per} blocks per cell"
    return (f"<div><b>{escape(name)} pool</b>: {pool['num_used']} of {pool['num_blocks']} blocks used "
            f"({pool['block_size']} tokens each; {scale})</div>"
            f'<div style="max-width:640px;line-height:0">{"".join(cells)}</div>')


def fig2_html(stats: dict) -> str:
    """The live Figure 2 bar: shares of KV slots by state."""
    total = sum(stats[key] for key, _, _ in FIG2) or 1
    parts = "".join(f'<span title="{label}: {stats[key]} slots" style="display:inline-block;height:14px;'
                    f'width:{100 * stats[key] / total:.2f}%;background:{colour}"></span>'
                    for key, label, colour in FIG2)
    legend = " · ".join(f'<span style="color:{colour}">■</span> {label} {stats[key]}' for key, label, colour in FIG2)
    return (f'<div style="max-width:640px;margin-top:6px"><div style="display:flex">{parts}</div>'
            f"<small>KV slots: {legend}</small></div>")


def queues_html(snap: dict) -> str:
    """Each queue's requests, every sequence's table as ``logical->physical (#filled)``."""
    rows = []
    for queue, indices in snap["queues"].items():
        for i in indices:
            req = snap["requests"][i]
            swatch = f'<span style="color:{owner_colour(req["arrival"], 0.7)}">■</span>'
            for seq in req["seqs"]:
                table = ", ".join(f"{logical}&rarr;{block} ({filled})"
                                  for logical, (block, filled) in enumerate(seq["table"]))
                rows.append(f"<tr><td>{queue}</td><td>{swatch} {escape(req['id'])}</td><td>{seq['seq_id']}</td>"
                            f"<td>{seq['status']}</td><td>{seq['pool']}</td><td>{table or '&ndash;'}</td></tr>")
    counts = ", ".join(f"{q} {n}" for q, n in snap["queue_lengths"].items())
    head = "<tr><th>queue</th><th>request</th><th>seq</th><th>status</th><th>pool</th>" \
           "<th>block table: logical&rarr;physical (#filled)</th></tr>"
    return f"<div style='margin-top:6px'>queues: {counts}</div><table>{head}{''.join(rows)}</table>"


def snapshot_html(snap: dict) -> str:
    """The whole picture of one snapshot as an HTML fragment."""
    pools = "".join(pool_html(name, pool, snap["requests"]) for name, pool in snap["pools"].items())
    legend = (f'<small><span style="background:{FREE}">&nbsp;&nbsp;&nbsp;</span> free · '
              f'<span style="background:{PARKED}">&nbsp;&nbsp;&nbsp;</span> parked in the prefix cache · '
              f'<span style="background:{owner_colour(3, 0.2)}">&nbsp;&nbsp;&nbsp;</span>'
              f'<span style="background:{owner_colour(3, 1)}">&nbsp;&nbsp;&nbsp;</span> a request, emptier → fuller · '
              f'<span style="box-shadow:{SHARED_FRAME}">&nbsp;&nbsp;&nbsp;</span> shared (ref count > 1)</small>')
    return (f'<div class="paged-kv" style="font:12px sans-serif">{pools}{legend}'
            f"{fig2_html(snap['stats'])}{queues_html(snap)}</div>")
