"""Prometheus metrics of one `tinyt serve` (GET /metrics): requests by endpoint and status,
prompt and generated tokens, time to the first token and between tokens, and the engine's
queue depth and running rows, read when scraped (an encoder-decoder's engine: also the most
rows one step and one decoder run took)."""
from __future__ import annotations

from typing import Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

TTFT_BUCKETS = (.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30)  # seconds
TBT_BUCKETS = (.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1)
CONTENT_TYPE = "text/plain; version=0.0.4"  # Prometheus' text format


class EngineLoad(Protocol):
    """What the gauges read of an engine (tinyt.runtime.engine.Engine)."""

    @property
    def queue_depth(self) -> int: ...

    @property
    def running(self) -> int: ...


class Metrics:
    """Prometheus metrics of one server (a registry of its own, so servers in one process
    do not share counters)."""

    def __init__(self, engine: EngineLoad):
        self.registry = r = CollectorRegistry()
        self.requests = Counter("tinyt_requests", "HTTP requests by endpoint and status",
                                ["endpoint", "status"], registry=r)
        self.prompt_tokens = Counter("tinyt_prompt_tokens", "prompt tokens read", registry=r)
        self.generated = Counter("tinyt_generated_tokens", "tokens generated", registry=r)
        self.ttft = Histogram("tinyt_time_to_first_token_seconds", "submit to first token",
                              buckets=TTFT_BUCKETS, registry=r)
        self.tbt = Histogram("tinyt_time_between_tokens_seconds", "between a request's tokens",
                             buckets=TBT_BUCKETS, registry=r)
        Gauge("tinyt_queue_depth", "requests waiting for a row",
              registry=r).set_function(lambda: engine.queue_depth)
        Gauge("tinyt_running_rows", "rows in the running batch",
              registry=r).set_function(lambda: engine.running)
        # a running total read when scraped (the engine counts; prometheus-client's Counter
        # cannot be read from a function)
        Gauge("tinyt_prefix_reused_tokens", "prompt tokens copied from kept prefixes instead "
              "of computed", registry=r).set_function(
                  lambda: getattr(engine, "prefix_reused_tokens", 0))
        Gauge("tinyt_shared_prompt_tokens", "prompt tokens copied from an identical prompt "
              "admitted with them (a request's n samples) instead of computed",
              registry=r).set_function(lambda: getattr(engine, "shared_prompt_tokens", 0))
        if hasattr(engine, "widest_run"):  # an encoder-decoder's (runtime/seq2seq_engine.py)
            for name, what in (("widest_step", "the most rows that took a token in one step"),
                               ("widest_run", "the most rows in one run of the decoder"),
                               ("decoder_runs", "runs of the decoder graphs")):
                Gauge(f"tinyt_{name}" + ("_rows" if name != "decoder_runs" else ""), what,
                      registry=r).set_function(lambda name=name: getattr(engine, name))

    def answered(self, endpoint: str, status: int) -> None:
        """One request of `endpoint` answered with `status`."""
        self.requests.labels(endpoint, str(status)).inc()

    def token(self, seconds: float, *, first: bool) -> None:
        """One generated token, `seconds` after the request's submission (first) or after
        its previous token."""
        (self.ttft if first else self.tbt).observe(seconds)
        self.generated.inc()

    def render(self) -> bytes:
        """The registry in Prometheus' text format (CONTENT_TYPE)."""
        return generate_latest(self.registry)
