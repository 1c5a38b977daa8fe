"""observe/prom.py: the exposition format read back, histogram windows and quantiles."""

from __future__ import annotations

import pytest

from hetcompile.observe import prom

TEXT = """# HELP vllm:request_success_total done
# TYPE vllm:request_success_total counter
vllm:request_success_total{engine="0",finished_reason="length",model_name="m"} 7.0
vllm:request_success_total{engine="0",finished_reason="stop",model_name="m"} 3.0
vllm:x_bucket{le="0.1",model_name="m"} 2.0
vllm:x_bucket{le="0.5",model_name="m"} 6.0
vllm:x_bucket{le="+Inf",model_name="m"} 10.0
vllm:x_sum{model_name="m"} 3.0
vllm:x_count{model_name="m"} 10.0
odd{path="a \\"quoted\\", b\\\\c"} 1 1700000000000
"""


def test_counters_sum_over_their_series_and_labels_unescape() -> None:
    s = prom.parse(TEXT)
    assert prom.total(s, "vllm:request_success_total") == 10.0
    assert prom.total(s, "vllm:request_success_total", {"finished_reason": "stop"}) == 3.0
    assert prom.total(s, "absent") is None
    assert ("odd", (("path", 'a "quoted", b\\c'),)) in s


def test_histogram_quantiles_interpolate_inside_a_bucket_as_prometheus_does() -> None:
    h = prom.histogram(prom.parse(TEXT), "vllm:x")
    assert h is not None and h.mean == pytest.approx(0.3)
    assert h.quantile(0.1) == pytest.approx(0.05)  # rank 1 of 2 in [0, 0.1]
    assert h.quantile(0.4) == pytest.approx(0.1 + 0.4 * 2 / 4)  # rank 4: 2 into the 4 of (0.1, 0.5]
    assert h.quantile(0.99) == pytest.approx(0.5)  # the +Inf bucket: the largest finite bound


def test_a_window_is_the_difference_and_a_restart_is_not_one() -> None:
    a = prom.Hist(((0.1, 2.0), (float("inf"), 4.0)), 1.0, 4.0)
    b = prom.Hist(((0.1, 5.0), (float("inf"), 9.0)), 2.5, 9.0)
    d = b.minus(a)
    assert d is not None and d.buckets == ((0.1, 3.0), (float("inf"), 5.0)) and d.count == 5.0 and d.sum == 1.5
    assert a.minus(b) is None  # counters went down: the process restarted between the scrapes


@pytest.mark.parametrize("bad", ["<html>nope</html>", 'm{le="1} 2', "m 1.2.3"])
def test_malformed_text_is_an_exposition_error(bad: str) -> None:
    with pytest.raises(prom.ExpositionError):
        prom.parse(bad)
