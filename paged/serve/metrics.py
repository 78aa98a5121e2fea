"""``GET /metrics``: the engine's state in Prometheus text format (``prometheus_client``).

Two kinds of series:

* **from the engine's ``stats()``** (read at scrape time from the snapshot the
  engine thread refreshes): queue lengths, KV blocks used / free per pool, the
  prefix-cache hit rate, preemptions by mode, prompt and generation token
  counters, and the live Figure 2 breakdown of KV memory — slots holding token
  states, slots lost to internal fragmentation (the empty tail of each
  sequence's last block), free slots. The paper's Figure 2 shows this for
  finished traces; here it is the current state of a running server.
* **observed by the server per request**: time to first token, time per output
  token, end-to-end latency, and requests finished by reason.

Every server gets its own ``CollectorRegistry``, so several servers (tests) in
one process never collide.
"""

from __future__ import annotations

from fastapi.responses import PlainTextResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

PREFIX = "paged_"
_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class EngineCollector:
    """Turns the latest ``engine.stats()`` snapshot into metric families at scrape time.

    Args:
        get_stats: returns the snapshot dict (see ``Engine.stats``).
        device: the KV cache's device type, the ``device`` label of the main pool.
    """

    def __init__(self, get_stats, device: str) -> None:
        self.get_stats = get_stats
        self.device = device

    def collect(self):
        s = self.get_stats()
        for name, key, doc in (("num_requests_running", "running", "Requests in the running batch."),
                               ("num_requests_waiting", "waiting", "Requests queued, not started."),
                               ("num_requests_swapped", "swapped", "Requests preempted to the swap pool.")):
            g = GaugeMetricFamily(PREFIX + name, doc)
            g.add_metric([], s.get(key, 0))
            yield g
        blocks = GaugeMetricFamily(PREFIX + "kv_blocks", "KV cache blocks by pool and state "
                                   "(free includes cached-but-unreferenced prefix blocks).",
                                   labels=["device", "state"])
        for state in ("total", "used", "free"):
            blocks.add_metric([self.device, state], s.get(f"blocks_{state}", 0))
        if "swap_blocks_total" in s:  # the host swap pool of step05+ engines
            total, used = s["swap_blocks_total"], s.get("swap_blocks_used", 0)
            for state, n in (("total", total), ("used", used), ("free", s.get("swap_blocks_free", total - used))):
                blocks.add_metric(["cpu_swap", state], n)
        yield blocks
        usage = GaugeMetricFamily(PREFIX + "kv_cache_usage_ratio", "Fraction of KV blocks in use.",
                                  labels=["device"])
        usage.add_metric([self.device], s.get("blocks_used", 0) / max(1, s.get("blocks_total", 1)))
        yield usage
        slots = GaugeMetricFamily(PREFIX + "kv_slots", "Figure 2 live: KV token slots holding token "
                                  "states, lost to internal fragmentation, and free.", labels=["state"])
        slots.add_metric(["token_states"], s.get("token_slots_filled", 0))
        slots.add_metric(["internal_fragmentation"], s.get("internal_fragmentation_slots", 0))
        slots.add_metric(["free"], s.get("free_slots", 0))
        yield slots
        hit = GaugeMetricFamily(PREFIX + "prefix_cache_hit_rate", "Prompt blocks found in the prefix cache.")
        hit.add_metric([], s.get("prefix_cache_hit_rate", 0.0))
        yield hit
        pre = CounterMetricFamily(PREFIX + "preemptions", "Requests preempted, by mode.", labels=["mode"])
        for mode, n in (s.get("preemptions") or {"swap": 0, "recompute": 0}).items():
            pre.add_metric([mode], n)
        yield pre
        for name, key, doc in (("prompt_tokens", "prompt_tokens_total", "Prompt tokens computed."),
                               ("generation_tokens", "generation_tokens_total", "Tokens generated.")):
            c = CounterMetricFamily(PREFIX + name, doc)
            c.add_metric([], s.get(key, 0))
            yield c


class ServerMetrics:
    """The registry behind ``/metrics`` and the per-request observations handlers make."""

    def __init__(self, get_stats, device: str) -> None:
        self.registry = CollectorRegistry()
        self.registry.register(EngineCollector(get_stats, device))
        self.ttft = Histogram(PREFIX + "time_to_first_token_seconds", "Arrival to first generated token.",
                              buckets=_LATENCY_BUCKETS, registry=self.registry)
        self.tpot = Histogram(PREFIX + "time_per_output_token_seconds",
                              "Time between consecutive output tokens of a request.",
                              buckets=_LATENCY_BUCKETS, registry=self.registry)
        self.e2e = Histogram(PREFIX + "e2e_request_latency_seconds", "Arrival to last token.",
                             buckets=_LATENCY_BUCKETS, registry=self.registry)
        self.finished = Counter(PREFIX + "requests_finished", "Engine requests ended, by finish reason "
                                "(abort: the client went away).", ["finish_reason"], registry=self.registry)

    def render(self) -> bytes:
        return generate_latest(self.registry)


def install(app, metrics: ServerMetrics) -> None:
    """Add ``GET /metrics`` (no API key: scrapers read it) to ``app``."""

    @app.get("/metrics", tags=["server"], summary="Prometheus metrics", response_class=PlainTextResponse,
             responses={200: {"content": {CONTENT_TYPE_LATEST.split(";")[0]: {"schema": {"type": "string"}}},
                              "description": "Prometheus text exposition format"}})
    async def prometheus():
        return Response(metrics.render(), media_type=CONTENT_TYPE_LATEST)
