/* The block-table player: replays a recorded engine run, one iteration at a time.
 *
 * A page holds  <div class="kv-player" data-run="step04"></div>  and loads the run's data,
 * a script that sets window.KV_RUNS["step04"] (tools/record_runs.py writes it at docs build
 * time: per iteration the engine's snapshot, reference counts, events and plan). This file
 * draws each frame: the iteration's events in words, what each sequence fed in and sampled,
 * every pool's blocks (owner colour, reference count, a frame when shared, a mark on the
 * blocks this iteration touched) and every sequence's block table. A slider, step buttons,
 * play / pause and the arrow keys move between frames. Plain DOM, no library, no server.
 *
 * The element carries the frame shown in data-frame (tests/test_player.py reads it).
 */
(function () {
  "use strict";

  function el(tag, cls, text) {
    const node = document.createElement(tag);
    if (cls) node.className = cls;
    if (text !== undefined) node.textContent = text;
    return node;
  }

  // the colours of paged/step04_sharing/snapshot_html.py: a hue per request from its arrival
  function colour(arrival, fill) {
    const hue = Math.round((arrival * 137.508) % 360);
    return "hsl(" + hue + ", 65%, " + Math.round(88 - 43 * fill) + "%)";
  }

  function token(t) {
    return t === "" ? "‹s›" : t.replace(/ /g, "␣").replace(/\n/g, "⏎");
  }

  function oneLine(text) {
    return text.replace(/\n/g, "⏎");
  }

  function seqNames(run) {
    // seq id -> "request id" or "request id · seq k" when a request has several sequences
    const names = {};
    const counts = {};
    run.frames.forEach(function (f) {
      f.snapshot.requests.forEach(function (r) {
        counts[r.id] = Math.max(counts[r.id] || 0, r.seqs.length);
      });
    });
    run.frames.forEach(function (f) {
      f.snapshot.requests.forEach(function (r) {
        r.seqs.forEach(function (s) {
          names[s.seq_id] = counts[r.id] > 1 ? r.id + "·" + s.seq_id : r.id;
        });
      });
    });
    return names;
  }

  function describe(e, names) {
    const who = e.seq === null || e.seq === undefined ? e.request : (names[e.seq] || e.request);
    const d = e.detail || {};
    switch (e.kind) {
      case "admitted": return who + " admitted";
      case "allocated":
        return who + ": block" + (d.blocks.length === 1 ? " " : "s ") + d.blocks.join(", ") + " taken" +
          (d.cached && d.cached.length ? "; cached block" + (d.cached.length === 1 ? " " : "s ") +
            d.cached.join(", ") + " mapped (prefix cache)" : "");
      case "cow": return who + ": copy-on-write, block " + d.src + " → " + d.dst;
      case "preempted": return who + " preempted (" + d.mode + ")";
      case "swapped_out": return who + " swapped out: " + d.blocks.map(function (p) { return p[0] + "→host " + p[1]; }).join(", ");
      case "swapped_in": return who + " swapped in: " + d.blocks.map(function (p) { return "host " + p[0] + "→" + p[1]; }).join(", ");
      case "finished": return who + " finished (" + d.reason + ")";
      case "aborted": return who + " aborted";
      default: return who + ": " + e.kind;
    }
  }

  // blocks an iteration touched, per pool: {block: "new" | "cow" | "swap"}
  function touched(frame) {
    const marks = { device: {}, host: {} };
    frame.events.forEach(function (e) {
      const d = e.detail || {};
      if (e.kind === "allocated") d.blocks.forEach(function (b) { marks.device[b] = "new"; });
      if (e.kind === "cow") { marks.device[d.src] = "cow"; marks.device[d.dst] = "cow"; }
      if (e.kind === "swapped_out") d.blocks.forEach(function (p) { marks.device[p[0]] = "swap"; marks.host[p[1]] = "swap"; });
      if (e.kind === "swapped_in") d.blocks.forEach(function (p) { marks.host[p[0]] = "swap"; marks.device[p[1]] = "swap"; });
    });
    return marks;
  }

  function drawPool(name, pool, refs, requests, marks) {
    const box = el("div", "kvp-pool");
    box.appendChild(el("div", "kvp-label", name + " pool: " + pool.num_used + " of " + pool.num_blocks +
      " blocks used (" + pool.block_size + " tokens each)"));
    const grid = el("div", "kvp-grid");
    for (let c = 0; c < pool.used.length; c++) {
      const cell = el("div", "kvp-cell");
      cell.dataset.block = c;
      const ref = refs ? refs[c] : pool.used[c];
      if (pool.used[c]) {
        const owner = pool.owner[c];
        const arrival = owner >= 0 ? requests[owner].arrival : 0;
        cell.style.background = owner >= 0 ? colour(arrival, pool.filled[c] / pool.block_size) : "#999";
        cell.title = "block " + c + ": " + (owner >= 0 ? requests[owner].id : "?") + ", reference count " + ref +
          ", " + pool.filled[c] + "/" + pool.block_size + " slots filled";
      } else {
        cell.classList.add(pool.parked[c] ? "kvp-parked" : "kvp-free");
        cell.title = "block " + c + (pool.parked[c] ? ": free, still findable in the prefix cache" : ": free");
      }
      if (ref > 1) cell.classList.add("kvp-shared");
      if (marks[c]) cell.classList.add("kvp-" + marks[c]);
      cell.appendChild(el("span", "kvp-id", String(c)));
      if (ref > 0) cell.appendChild(el("span", "kvp-ref", "×" + ref));
      grid.appendChild(cell);
    }
    box.appendChild(grid);
    return box;
  }

  function drawTables(frame, run, names, marks) {
    const box = el("div", "kvp-tables");
    const snap = frame.snapshot;
    const plan = {};
    (frame.plan ? frame.plan.seqs : []).forEach(function (p) { plan[p.seq_id] = p; });
    const rows = [];
    Object.keys(snap.queues).forEach(function (queue) {
      snap.queues[queue].forEach(function (i) { rows.push([queue, snap.requests[i]]); });
    });
    if (!rows.length) box.appendChild(el("div", "kvp-none", "no request in the engine"));
    rows.forEach(function (pair) {
      const queue = pair[0], req = pair[1];
      req.seqs.forEach(function (seq) {
        const row = el("div", "kvp-row");
        const swatch = el("span", "kvp-who", names[seq.seq_id] || req.id);
        swatch.style.background = colour(req.arrival, 0.55);
        row.appendChild(swatch);
        row.appendChild(el("span", "kvp-queue", queue + (seq.pool === "host" ? " (host)" : "")));
        const table = el("span", "kvp-table");
        const pool = seq.pool === "host" ? "host" : "device";
        seq.table.forEach(function (entry) {
          const b = el("span", "kvp-entry", String(entry[0]));
          b.style.background = colour(req.arrival, entry[1] / run.block_size);
          b.title = "physical block " + entry[0] + ", " + entry[1] + " of " + run.block_size + " slots filled";
          if (marks[pool][entry[0]]) b.classList.add("kvp-" + marks[pool][entry[0]]);
          if ((frame.refs[pool] || [])[entry[0]] > 1) b.classList.add("kvp-shared");
          table.appendChild(b);
        });
        if (!seq.table.length) table.appendChild(el("span", "kvp-none", "no block"));
        row.appendChild(table);
        const p = plan[seq.seq_id];
        const fed = p ? p.tokens.map(token).join(" ") + " → " + token(frame.sampled[seq.seq_id] || "") : "";
        row.appendChild(el("span", "kvp-fed", p ? (p.query_len > 1 ? "prompt in: " : "in: ") + fed : ""));
        const prompt = (run.prompts[req.id] || []).slice(1).join("");
        row.appendChild(el("span", "kvp-text", oneLine(prompt) + " ⟨" + oneLine(frame.texts[seq.seq_id] || "") + "⟩"));
        box.appendChild(row);
      });
    });
    return box;
  }

  function Player(root, run) {
    const names = seqNames(run);
    const last = run.frames.length - 1;
    root.innerHTML = "";
    root.appendChild(el("div", "kvp-title", run.title + " — " + last + " iterations, replayed from a real run"));
    const bar = el("div", "kvp-controls");
    const first = el("button", "kvp-first", "◀◀");
    const prev = el("button", "kvp-prev", "◀ step");
    const play = el("button", "kvp-play", "▶ play");
    const next = el("button", "kvp-next", "step ▶");
    const end = el("button", "kvp-last", "▶▶");
    const slider = el("input", "kvp-slider");
    slider.type = "range"; slider.min = 0; slider.max = last; slider.value = 0;
    const where = el("span", "kvp-where");
    [first, prev, play, next, end].forEach(function (b) { b.type = "button"; bar.appendChild(b); });
    first.title = "the start"; end.title = "the end"; prev.title = "one iteration back (←)"; next.title = "one iteration on (→)";
    slider.setAttribute("aria-label", "iteration");
    bar.appendChild(slider);
    bar.appendChild(where);
    root.appendChild(bar);
    const events = el("ul", "kvp-events");
    const body = el("div", "kvp-body");
    root.appendChild(events);
    root.appendChild(body);
    const legend = el("div", "kvp-legend");
    legend.innerHTML = '<span class="kvp-cell kvp-free"></span> free · <span class="kvp-cell kvp-parked"></span> ' +
      'free, in the prefix cache · <span class="kvp-cell kvp-shared"></span> shared (×n: reference count) · ' +
      '<span class="kvp-cell kvp-new"></span> taken this iteration · <span class="kvp-cell kvp-cow"></span> ' +
      'copy-on-write · <span class="kvp-cell kvp-swap"></span> swapped';
    root.appendChild(legend);
    let frame = 0, timer = null;

    function show(k) {
      frame = Math.max(0, Math.min(last, k));
      const f = run.frames[frame];
      root.dataset.frame = String(frame);
      slider.value = frame;
      where.textContent = frame === 0 ? "before iteration 1" : "after iteration " + frame + " of " + last;
      events.innerHTML = "";
      const said = f.events.map(function (e) { return describe(e, names); });
      if (frame === 0) said.push("nothing has run: every request waits");
      else if (!said.length) said.push("every running sequence decodes one token; no block taken or freed");
      said.forEach(function (text) { events.appendChild(el("li", null, text)); });
      body.innerHTML = "";
      const marks = touched(f);
      Object.keys(f.snapshot.pools).forEach(function (name) {
        body.appendChild(drawPool(name, f.snapshot.pools[name], f.refs[name], f.snapshot.requests, marks[name] || {}));
      });
      body.appendChild(drawTables(f, run, names, marks));
      prev.disabled = frame === 0; first.disabled = frame === 0;
      next.disabled = frame === last; end.disabled = frame === last;
    }

    function stop() {
      if (timer) { clearInterval(timer); timer = null; }
      play.textContent = "▶ play";
      root.dataset.playing = "false";
    }

    function start() {
      if (frame === last) show(0);
      timer = setInterval(function () { if (frame >= last) stop(); else show(frame + 1); }, 900);
      play.textContent = "⏸ pause";
      root.dataset.playing = "true";
    }

    first.addEventListener("click", function () { stop(); show(0); });
    prev.addEventListener("click", function () { stop(); show(frame - 1); });
    next.addEventListener("click", function () { stop(); show(frame + 1); });
    end.addEventListener("click", function () { stop(); show(last); });
    play.addEventListener("click", function () { if (timer) stop(); else start(); });
    slider.addEventListener("input", function () { stop(); show(Number(slider.value)); });
    root.tabIndex = 0;
    root.addEventListener("keydown", function (e) {
      if (e.key === "ArrowRight") { stop(); show(frame + 1); e.preventDefault(); }
      if (e.key === "ArrowLeft") { stop(); show(frame - 1); e.preventDefault(); }
    });
    stop();
    show(0);
  }

  function init() {
    document.querySelectorAll(".kv-player").forEach(function (root) {
      const run = (window.KV_RUNS || {})[root.dataset.run];
      if (!run) {
        root.textContent = "This run was not recorded: build the site with `make docs` (tools/record_runs.py).";
        return;
      }
      Player(root, run);
    });
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", init);
  else init();
})();
