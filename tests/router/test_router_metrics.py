"""Prometheus text output of the router, and parsing vLLM's."""

from __future__ import annotations

import re

import pytest

from hetcompile.router.health import parse_vllm_metrics
from hetcompile.router.metrics import Counter, Gauge, Histogram, Registry, RouterMetrics

SAMPLE = re.compile(r'^[a-zA-Z_:][a-zA-Z0-9_:]*(\{([a-zA-Z_][a-zA-Z0-9_]*="([^"\\]|\\.)*",?)*\})? -?[0-9.e+Inf-]+(NaN)?$')


def check_exposition(text: str) -> dict[str, str]:
    """Every family has HELP then TYPE before its samples; every sample line is well formed."""
    types: dict[str, str] = {}
    current = None
    for line in text.splitlines():
        if line.startswith("# HELP "):
            current = line.split()[2]
        elif line.startswith("# TYPE "):
            name, kind = line.split()[2:4]
            assert name == current, f"TYPE {name} without its HELP"
            types[name] = kind
        else:
            assert SAMPLE.match(line), line
            base = line.split("{")[0].split(" ")[0]
            fam = re.sub(r"_(bucket|sum|count)$", "", base) if types.get(current) == "histogram" else base
            assert fam == current, f"{line} outside its family {current}"
    assert text.endswith("\n")
    return types


def test_histogram_buckets_cumulative_with_inf_sum_count():
    h = Histogram("t_seconds", "test", ("m",), buckets=(0.1, 1.0))
    for v in (0.05, 0.1, 0.5, 2.0):
        h.observe(("a",), v)
    r = Registry()
    r.add(h)
    text = r.render()
    check_exposition(text)
    assert 't_seconds_bucket{m="a",le="0.1"} 2' in text  # le is inclusive
    assert 't_seconds_bucket{m="a",le="1"} 3' in text
    assert 't_seconds_bucket{m="a",le="+Inf"} 4' in text
    assert 't_seconds_sum{m="a"} 2.65' in text
    assert 't_seconds_count{m="a"} 4' in text


def test_counter_gauge_and_label_escaping():
    c = Counter("x_total", "x", ("k",))
    c.inc(('a"b\\c\nd',))
    c.inc(('a"b\\c\nd',), 2)
    g = Gauge("g", "g", ("k",), fn=lambda: [(("z",), 0.5)])
    r = Registry()
    r.add(c)
    r.add(g)
    text = r.render()
    check_exposition(text)
    assert 'x_total{k="a\\"b\\\\c\\nd"} 3' in text
    assert 'g{k="z"} 0.5' in text
    with pytest.raises(ValueError):
        Counter("x", "counters end in _total")
    with pytest.raises(ValueError):
        r.add(Counter("x_total", "dup"))


def test_router_metrics_render_is_valid():
    m = RouterMetrics()
    m.requests.inc(("tiny", "short", "200"))
    m.latency.observe(("tiny",), 0.003)
    m.ttfb.observe(("r0",), 0.001)
    m.choices.inc(("weighted", "r0"))
    types = check_exposition(m.render())
    assert types["hetcompile_router_requests_total"] == "counter"
    assert types["hetcompile_router_request_duration_seconds"] == "histogram"
    assert types["hetcompile_router_inflight_requests"] == "gauge"


VLLM_TEXT = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="tiny"} 8.0
vllm:num_requests_running{engine="1",model_name="tiny"} 2.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="tiny"} 1.0 1700000000000
# HELP vllm:num_requests_waiting_by_reason Number of requests waiting, by reason.
# TYPE vllm:num_requests_waiting_by_reason gauge
vllm:num_requests_waiting_by_reason{engine="0",model_name="tiny",reason="capacity"} 9.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="tiny"} 0.0039
vllm:kv_cache_usage_perc{engine="1",model_name="tiny"} 0.25
vllm:kv_cache_usage_perc_extra 0.99
# HELP vllm:prompt_tokens_total Number of prefill tokens processed.
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{engine="0",model_name="tiny"} 1234.0
"""


def test_parse_vllm_metrics():
    g = parse_vllm_metrics(VLLM_TEXT)
    assert g.running == 10.0  # summed over engines
    assert g.waiting == 1.0  # not confused with waiting_by_reason; timestamp ignored
    assert g.kv_usage == 0.25  # the fullest engine
    assert parse_vllm_metrics("").kv_usage is None
    assert parse_vllm_metrics("vllm:kv_cache_usage_perc 0.5\n").kv_usage == 0.5
