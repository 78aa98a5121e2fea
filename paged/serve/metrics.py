"""``GET /metrics``: the engine's state and the requests' latencies in Prometheus text format.

The series vLLM exports keep vLLM's names and labels (``vllm:`` prefix,
``model_name`` and ``engine`` labels), so vLLM's Grafana dashboard and other
tooling that reads them work unchanged:

* **from the engine's ``stats()``** (read at scrape time from the snapshot the
  engine thread refreshes): requests running / waiting / swapped, the KV
  cache's usage (``vllm:kv_cache_usage_perc``, and ``vllm:gpu_cache_usage_perc``,
  the older name the example dashboard reads, whatever the device), the swap
  pool's (``vllm:cpu_cache_usage_perc``), preemptions and tokens generated;
* **observed per request** (``RequestTimer``, on the event loop, from the
  outputs a request receives and the iteration that admitted it): prompt
  tokens (cached ones included, as vLLM counts them), prefix-cache queries and
  hits in tokens, time to first token, the time between a request's token
  steps (``vllm:inter_token_latency_seconds``; also under the older
  ``vllm:time_per_output_token_seconds``), end-to-end latency, the time queued,
  in prefill, in decode, and the request's sizes; requests finished by reason;
* **per iteration** (an engine observer): tokens per iteration.

paged's own series keep the ``paged_`` prefix: the KV blocks by pool and state,
the live Figure 2 breakdown of the slots, the block-level prefix-cache hit
rate, preemptions by mode, and the prompt tokens actually computed. Every
server gets its own ``CollectorRegistry``, so several servers (tests) in one
process never collide.
"""

from __future__ import annotations

import time

from fastapi.responses import PlainTextResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

PREFIX = "paged_"
VLLM = "vllm:"
# vLLM's buckets (seconds, tokens), so that quantiles read off the dashboard compare with a vLLM server's
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
               80.0)
REQUEST_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
                   480.0, 960.0, 1920.0, 7680.0)
TOKEN_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000, 100000)
MAX_ADMITTED = 100_000  # admission times kept for requests not yet seen finishing (dropped oldest first past it)


class EngineCollector:
    """Turns the latest ``engine.stats()`` snapshot into metric families at scrape time.

    Args:
        get_stats: returns the snapshot dict (see ``Engine.stats``).
        device: the KV cache's device type, the ``device`` label of the main pool.
        model_name: the served name, the ``model_name`` label of vLLM's series.
    """

    def __init__(self, get_stats, device: str, model_name: str) -> None:
        self.get_stats = get_stats
        self.device = device
        self.labels = {"model_name": model_name, "engine": "0"}

    def _vllm(self, kind, name: str, doc: str, value: float):
        family = kind(VLLM + name, doc, labels=list(self.labels))
        family.add_metric(list(self.labels.values()), value)
        return family

    def collect(self):
        s = self.get_stats()
        for name, key, doc in (("num_requests_running", "running", "Requests in the running batch."),
                               ("num_requests_waiting", "waiting", "Requests queued, not started."),
                               ("num_requests_swapped", "swapped", "Requests preempted to the swap pool.")):
            yield self._vllm(GaugeMetricFamily, name, doc, s.get(key, 0))
        usage = s.get("blocks_used", 0) / max(1, s.get("blocks_total", 1))
        yield self._vllm(GaugeMetricFamily, "kv_cache_usage_perc", "Fraction of KV cache blocks in use (0 to 1).",
                         usage)
        yield self._vllm(GaugeMetricFamily, "gpu_cache_usage_perc", "The same, under vLLM's older name.", usage)
        swap = s.get("swap_blocks_used", 0) / max(1, s.get("swap_blocks_total", 1))
        yield self._vllm(GaugeMetricFamily, "cpu_cache_usage_perc", "Fraction of the host swap pool in use.", swap)
        preempted = s.get("preemptions") or {"swap": 0, "recompute": 0}
        yield self._vllm(CounterMetricFamily, "num_preemptions", "Requests preempted.", sum(preempted.values()))
        yield self._vllm(CounterMetricFamily, "generation_tokens", "Tokens generated.",
                         s.get("generation_tokens_total", 0))
        yield from self._own(s, preempted)

    def _own(self, s: dict, preempted: dict):
        """paged's series: pools by state, Figure 2's slots, the block-level hit rate, preemptions by mode."""
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
        for mode, n in preempted.items():
            pre.add_metric([mode], n)
        yield pre
        computed = CounterMetricFamily(PREFIX + "prompt_tokens_computed", "Prompt tokens computed (those found "
                                       "in the prefix cache are not).")
        computed.add_metric([], s.get("prompt_tokens_total", 0))
        yield computed


class ServerMetrics:
    """The registry behind ``/metrics`` and the per-request and per-iteration observations.

    Args:
        get_stats: the engine's latest ``stats()`` snapshot.
        device: the KV cache's device type.
        model_name: the served name (vLLM's ``model_name`` label).
    """

    def __init__(self, get_stats, device: str, model_name: str = "") -> None:
        self.registry = CollectorRegistry()
        self.registry.register(EngineCollector(get_stats, device, model_name))
        names, values = ["model_name", "engine"], [model_name, "0"]

        def series(kind, name, doc, **extra):
            labels = names + extra.pop("labels", [])
            made = kind(VLLM + name, doc, labels, registry=self.registry, **extra)
            return made if len(labels) > len(names) else made.labels(*values)

        self.labels = values
        self.prompt_tokens = series(Counter, "prompt_tokens", "Prompt tokens of the requests (cached ones too).")
        self.cache_queries = series(Counter, "prefix_cache_queries", "Prompt tokens looked up in the prefix cache.")
        self.cache_hits = series(Counter, "prefix_cache_hits", "Prompt tokens found in the prefix cache.")
        self.success = series(Counter, "request_success", "Requests finished, by reason (abort: the client "
                              "went away).", labels=["finished_reason"])
        self.ttft = series(Histogram, "time_to_first_token_seconds", "Arrival to the first token.",
                           buckets=TTFT_BUCKETS)
        self.itl = series(Histogram, "inter_token_latency_seconds", "Between a request's consecutive token steps.",
                          buckets=ITL_BUCKETS)
        self.tpot = series(Histogram, "time_per_output_token_seconds", "The same, under vLLM's older name.",
                           buckets=ITL_BUCKETS)
        self.e2e = series(Histogram, "e2e_request_latency_seconds", "Arrival to the last token.",
                          buckets=REQUEST_BUCKETS)
        self.queue = series(Histogram, "request_queue_time_seconds", "Arrival to the iteration that admitted it.",
                            buckets=REQUEST_BUCKETS)
        self.prefill = series(Histogram, "request_prefill_time_seconds", "Admission to the first token.",
                              buckets=REQUEST_BUCKETS)
        self.decode = series(Histogram, "request_decode_time_seconds", "First token to the last.",
                             buckets=REQUEST_BUCKETS)
        self.inference = series(Histogram, "request_inference_time_seconds", "Admission to the last token.",
                                buckets=REQUEST_BUCKETS)
        self.request_prompt = series(Histogram, "request_prompt_tokens", "Prompt tokens per request.",
                                     buckets=TOKEN_BUCKETS)
        self.request_generation = series(Histogram, "request_generation_tokens", "Tokens generated per request.",
                                         buckets=TOKEN_BUCKETS)
        self.request_max_generation = series(Histogram, "request_max_num_generation_tokens", "Tokens of the "
                                             "longest sequence of a request.", buckets=TOKEN_BUCKETS)
        self.params_n = series(Histogram, "request_params_n", "The n of each request.", buckets=(1, 2, 5, 10, 20))
        self.params_max_tokens = series(Histogram, "request_params_max_tokens", "The max_tokens of each request.",
                                        buckets=TOKEN_BUCKETS)
        self.iteration_tokens = series(Histogram, "iteration_tokens_total", "Tokens computed per engine iteration.",
                                       buckets=TOKEN_BUCKETS)
        self.admitted: dict[str, float] = {}  # engine request id -> start of the iteration that admitted it

    def finished(self, reason: str, count: int = 1) -> None:
        self.success.labels(*self.labels, reason).inc(count)

    def observe_step(self, started: float, engine, plan) -> None:
        """After each iteration, on the engine thread: its token count, and the requests it admitted."""
        if plan.num_tokens:
            self.iteration_tokens.observe(plan.num_tokens)
        for event in engine.events:
            if event.kind == "admitted":
                self.admitted.setdefault(event.request_id, started)
        while len(self.admitted) > MAX_ADMITTED:
            self.admitted.pop(next(iter(self.admitted)))

    def render(self) -> bytes:
        return generate_latest(self.registry)


class RequestTimer:
    """One HTTP request's observations: its engine requests' outputs as they arrive.

    Args:
        metrics: the ``ServerMetrics``.
        params: the request's ``SamplingParams`` (its ``n`` and ``max_tokens``).
    """

    def __init__(self, metrics: ServerMetrics, params=None) -> None:
        self.metrics, self.t0 = metrics, time.monotonic()
        self.params = params
        self.first: dict[str, float] = {}
        self.last: dict[str, float] = {}
        self.tokens: dict[str, int] = {}

    def observe(self, out) -> None:
        m, rid, now = self.metrics, out.request_id, time.monotonic()
        n = sum(len(c.token_ids) for c in out.outputs)
        if rid not in self.tokens:  # the first output: the prompt was looked up in the prefix cache
            prompt = len(out.prompt_token_ids)
            m.prompt_tokens.inc(prompt)
            m.cache_queries.inc(prompt)
            m.cache_hits.inc(out.num_cached_tokens)
            m.request_prompt.observe(prompt)
            self.tokens[rid] = 0
        if n > self.tokens[rid]:
            if rid in self.last:
                m.itl.observe(now - self.last[rid])
                m.tpot.observe(now - self.last[rid])
            else:
                self.first[rid] = now
                m.ttft.observe(now - self.t0)
            self.last[rid], self.tokens[rid] = now, n
        if out.finished:
            self._finish(out, now)

    def _finish(self, out, now: float) -> None:
        m, rid = self.metrics, out.request_id
        m.e2e.observe(now - self.t0)
        admitted = m.admitted.pop(rid, None)
        first = self.first.get(rid, now)
        if admitted is not None:
            m.queue.observe(max(0.0, admitted - self.t0))
            m.prefill.observe(max(0.0, first - admitted))
            m.inference.observe(max(0.0, now - admitted))
        m.decode.observe(now - first)
        m.request_generation.observe(sum(len(c.token_ids) for c in out.outputs))
        m.request_max_generation.observe(max((len(c.token_ids) for c in out.outputs), default=0))
        if self.params is not None:
            m.params_n.observe(self.params.n)
            m.params_max_tokens.observe(self.params.max_tokens)
        for c in out.outputs:
            m.finished(c.finish_reason or "unknown")


def install(app, metrics: ServerMetrics) -> None:
    """Add ``GET /metrics`` (no API key: scrapers read it) to ``app``."""

    @app.get("/metrics", tags=["server"], summary="Prometheus metrics", response_class=PlainTextResponse,
             responses={200: {"content": {CONTENT_TYPE_LATEST.split(";")[0]: {"schema": {"type": "string"}}},
                              "description": "Prometheus text exposition format"}})
    async def prometheus():
        return Response(metrics.render(), media_type=CONTENT_TYPE_LATEST)
