"""tinyt.server.metrics without a server: counters and histograms move by what is recorded,
the gauges read the engine when scraped, and each server has a registry of its own."""
from types import SimpleNamespace

import pytest

pytest.importorskip("prometheus_client", reason="the serve extra is not installed")
pytest.importorskip("starlette", reason="the serve extra is not installed")

from tinyt.server.metrics import Metrics  # noqa: E402


def value(m: Metrics, name: str, **labels) -> float | None:
    return m.registry.get_sample_value(name, labels or None)


def test_requests_tokens_and_latencies_are_counted():
    m = Metrics(SimpleNamespace(queue_depth=0, running=0))
    m.answered("completions", 200)
    m.answered("completions", 200)
    m.answered("chat", 401)
    assert value(m, "tinyt_requests_total", endpoint="completions", status="200") == 2
    assert value(m, "tinyt_requests_total", endpoint="chat", status="401") == 1
    assert value(m, "tinyt_requests_total", endpoint="chat", status="200") is None
    m.prompt_tokens.inc(7)
    m.token(0.03, first=True)
    m.token(0.002, first=False)
    m.token(0.004, first=False)
    assert value(m, "tinyt_prompt_tokens_total") == 7
    assert value(m, "tinyt_generated_tokens_total") == 3
    assert value(m, "tinyt_time_to_first_token_seconds_count") == 1
    assert value(m, "tinyt_time_to_first_token_seconds_sum") == pytest.approx(0.03)
    assert value(m, "tinyt_time_between_tokens_seconds_count") == 2
    assert value(m, "tinyt_time_between_tokens_seconds_bucket", le="0.0025") == 1
    assert value(m, "tinyt_time_between_tokens_seconds_bucket", le="0.005") == 2


def test_gauges_read_the_engine_when_scraped():
    engine = SimpleNamespace(queue_depth=3, running=2)
    m = Metrics(engine)
    assert (value(m, "tinyt_queue_depth"), value(m, "tinyt_running_rows")) == (3, 2)
    engine.queue_depth, engine.running = 0, 5
    assert (value(m, "tinyt_queue_depth"), value(m, "tinyt_running_rows")) == (0, 5)
    text = m.render().decode()
    assert "tinyt_running_rows 5.0" in text and "tinyt_queue_depth 0.0" in text


def test_each_server_has_its_own_registry():
    a, b = (Metrics(SimpleNamespace(queue_depth=0, running=0)) for _ in range(2))
    a.answered("models", 200)
    assert value(a, "tinyt_requests_total", endpoint="models", status="200") == 1
    assert value(b, "tinyt_requests_total", endpoint="models", status="200") is None
