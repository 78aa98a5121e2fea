"""The block-table player (docs/player/player.js) in headless Chromium, on two recorded runs.

A page holds the players of step 04 (fork, copy-on-write, a cached prefix) and step 05
(preemption by swap: a host pool), each fed a real engine run recorded here with
``tools/record_runs.py``, the script the docs build runs. Chromium opens it over
loopback and the test drives it as a reader would: it must load with no console
error or failed request, start at frame 0, step forward and back, jump to the end and
play on its own; at the frame of a copy-on-write / a swap the touched blocks must be
marked, and every frame must draw one cell per block of each pool (exact counts).

Chromium is Debian's (``make test`` installs it as root, as ``make docs-check`` does);
where it cannot be, the test skips saying so. ``PLAYER_SCREENSHOTS=<folder>`` keeps the
screenshots of the step 05 player it takes at three frames.
"""

import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

import docs_check  # noqa: E402  (tools/ is not a package)
import record_runs  # noqa: E402

pytestmark = pytest.mark.skipif(
    shutil.which("chromium") is None,
    reason="Chromium is not installed: `make test` installs it (apt-get install -y chromium) when run as root; "
           "install it to run the player's test")

PAGE = """<!doctype html><html><head><meta charset="utf-8"><link rel="icon" href="data:,"><link rel="stylesheet" href="player.css"></head>
<body><div class="kv-player" id="p4" data-run="step04"></div><div class="kv-player" id="p5" data-run="step05"></div>
<script src="step04.js"></script><script src="step05.js"></script><script src="player.js"></script></body></html>"""


@pytest.fixture(scope="module")
def runs():
    model = record_runs.demo_model()
    return {"step04": record_runs.run_step04(model), "step05": record_runs.run_step05(model)}


@pytest.fixture(scope="module")
def tab(runs):
    with tempfile.TemporaryDirectory() as site, tempfile.TemporaryDirectory() as profile:
        site = Path(site)
        for name in ("player.js", "player.css"):
            shutil.copy(ROOT / "docs" / "player" / name, site / name)
        for name, run in runs.items():
            (site / f"{name}.js").write_text(f"(window.KV_RUNS = window.KV_RUNS || {{}})[{json.dumps(name)}] = "
                                             f"{json.dumps(run)};\n")
        (site / "index.html").write_text(PAGE)
        server = docs_check.serve(site)
        process, ws_url = docs_check.start_chromium(Path(profile))
        try:
            tab = docs_check.DevTools(ws_url)
            for domain in ("Page", "Runtime", "Log", "Network"):
                tab.send(f"{domain}.enable")
            tab.send("Page.navigate", url=f"http://127.0.0.1:{server.server_address[1]}/index.html")
            tab.wait_for("Page.loadEventFired")
            tab.settle()
            yield tab
        finally:
            process.terminate()
            process.wait(timeout=30)
            server.shutdown()


def js(tab, expression: str):
    result = tab.send("Runtime.evaluate", expression=expression, returnByValue=True)
    assert "exceptionDetails" not in result, result["exceptionDetails"]
    return result["result"].get("value")


def frame(tab, player: str) -> int:
    return int(js(tab, f"document.getElementById('{player}').dataset.frame"))


def click(tab, player: str, button: str) -> None:
    js(tab, f"document.querySelector('#{player} .kvp-{button}').click()")


def goto(tab, player: str, k: int) -> None:
    """Move the slider as a reader drags it: set the value, fire ``input``."""
    js(tab, f"(() => {{ const s = document.querySelector('#{player} .kvp-slider'); s.value = {k}; "
            "s.dispatchEvent(new Event('input')); })()")


def first_frame_with(run: dict, kind: str) -> int:
    return next(i for i, f in enumerate(run["frames"]) if any(e["kind"] == kind for e in f["events"]))


def test_player_loads_without_a_console_error_at_frame_zero(tab, runs):
    assert docs_check.problems_in_events(tab.events) == []
    for player, name in (("p4", "step04"), ("p5", "step05")):
        assert frame(tab, player) == 0
        assert js(tab, f"document.querySelector('#{player} .kvp-where').textContent") == "before iteration 1"
        assert int(js(tab, f"document.querySelector('#{player} .kvp-slider').max")) == len(runs[name]["frames"]) - 1


def test_player_steps_forward_and_back_and_jumps_to_either_end(tab, runs):
    last = len(runs["step05"]["frames"]) - 1
    click(tab, "p5", "next")
    assert frame(tab, "p5") == 1
    events = js(tab, "[...document.querySelectorAll('#p5 .kvp-events li')].map(li => li.textContent)")
    assert "A admitted" in events and "A: blocks 0, 1 taken" in events, events
    click(tab, "p5", "next")
    click(tab, "p5", "prev")
    assert frame(tab, "p5") == 1
    click(tab, "p5", "last")
    assert frame(tab, "p5") == last
    assert js(tab, "document.querySelector('#p5 .kvp-next').disabled") is True
    click(tab, "p5", "prev")
    assert frame(tab, "p5") == last - 1
    click(tab, "p5", "first")
    assert frame(tab, "p5") == 0
    assert docs_check.problems_in_events(tab.events) == []


def test_player_draws_one_cell_per_block_and_the_tables_of_every_frame(tab, runs):
    """At every frame: as many cells as blocks in each pool, each with its reference count as
    recorded, and one table row per sequence in the engine."""
    run = runs["step05"]
    for k, f in enumerate(run["frames"]):
        goto(tab, "p5", k)
        cells = js(tab, "[...document.querySelectorAll('#p5 .kvp-pool')].map(p => "
                        "[...p.querySelectorAll('.kvp-cell')].map(c => (c.querySelector('.kvp-ref') || {}).textContent || ''))")
        want = [[f"×{r}" if r else "" for r in f["refs"][pool]] for pool in f["snapshot"]["pools"]]
        assert cells == want, (k, cells, want)
        rows = js(tab, "document.querySelectorAll('#p5 .kvp-row').length")
        assert rows == sum(len(r["seqs"]) for r in f["snapshot"]["requests"]), k


def test_player_marks_the_blocks_of_a_copy_on_write_and_of_a_swap(tab, runs):
    cow = first_frame_with(runs["step04"], "cow")
    goto(tab, "p4", cow)
    src_dst = [(e["detail"]["src"], e["detail"]["dst"]) for e in runs["step04"]["frames"][cow]["events"]
               if e["kind"] == "cow"]
    marked = js(tab, "[...document.querySelectorAll('#p4 .kvp-pool .kvp-cow')].map(c => Number(c.dataset.block))")
    assert sorted(marked) == sorted({b for pair in src_dst for b in pair})
    assert js(tab, "document.querySelectorAll('#p4 .kvp-pool .kvp-shared').length") >= 1
    swap = first_frame_with(runs["step05"], "swapped_out")
    goto(tab, "p5", swap)
    moved = next(e["detail"]["blocks"] for e in runs["step05"]["frames"][swap]["events"] if e["kind"] == "swapped_out")
    pools = js(tab, "[...document.querySelectorAll('#p5 .kvp-pool')].map(p => "
                    "[...p.querySelectorAll('.kvp-swap')].map(c => Number(c.dataset.block)))")
    assert pools[1] == sorted(h for _, h in moved), pools  # the host pool: where they went
    taken = {b for e in runs["step05"]["frames"][swap]["events"] if e["kind"] == "allocated" for b in e["detail"]["blocks"]}
    assert set(pools[0]) == {d for d, _ in moved} - taken, pools  # a block freed and taken again shows as taken
    text = js(tab, "document.querySelector('#p5 .kvp-events').textContent")
    assert "C preempted (swap)" in text and "C swapped out" in text


def test_player_plays_and_pauses(tab, runs):
    click(tab, "p5", "first")
    click(tab, "p5", "play")
    assert js(tab, "document.getElementById('p5').dataset.playing") == "true"
    time.sleep(2.2)  # 900 ms per frame
    click(tab, "p5", "play")  # pause
    reached = frame(tab, "p5")
    assert reached >= 2 and js(tab, "document.getElementById('p5').dataset.playing") == "false"
    time.sleep(1.2)
    assert frame(tab, "p5") == reached, "a paused player moved"
    assert docs_check.problems_in_events(tab.events) == []


def test_player_frames_can_be_pictured(tab, runs, tmp_path):
    """A screenshot of the step 05 player after iteration 1, at the swap-out and at the swap-in is a PNG as
    wide as the player (into ``PLAYER_SCREENSHOTS=<folder>`` when set, to look at)."""
    import base64

    out = Path(os.environ.get("PLAYER_SCREENSHOTS") or tmp_path)
    out.mkdir(parents=True, exist_ok=True)
    run = runs["step05"]
    for k in (1, first_frame_with(run, "swapped_out"), first_frame_with(run, "swapped_in")):
        goto(tab, "p5", k)
        box = js(tab, "(() => { const r = document.getElementById('p5').getBoundingClientRect(); "
                      "return [r.x, r.y + window.scrollY, r.width, r.height]; })()")
        shot = tab.send("Page.captureScreenshot", format="png", captureBeyondViewport=True,
                        clip={"x": box[0], "y": box[1], "width": box[2], "height": box[3], "scale": 1})
        png = base64.b64decode(shot["data"])
        assert png.startswith(b"\x89PNG") and int.from_bytes(png[16:20], "big") == round(box[2]), k
        (out / f"player_step05_frame{k}.png").write_bytes(png)
