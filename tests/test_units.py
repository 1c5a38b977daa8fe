"""Lenient unit parsing: what users type -> SI numbers; clear errors otherwise."""

from __future__ import annotations

import pytest

from hetcompile.ir import units


@pytest.mark.parametrize(
    "text,expected",
    [("80GB", 80e9), ("24GiB", 24 * 2**30), ("512 MB", 512e6), (1024, 1024.0)],
)
def test_bytes(text, expected):
    assert units.parse_bytes(text) == pytest.approx(expected)


@pytest.mark.parametrize(
    "text,expected",
    [("10Gbps", 1.25e9), ("196Mbps", 24.5e6), ("900GB/s", 900e9), ("100 Mbit/s", 12.5e6)],
)
def test_bandwidth(text, expected):
    assert units.parse_bandwidth(text) == pytest.approx(expected)


@pytest.mark.parametrize("text,expected", [("150ms", 0.15), ("2s", 2.0), ("1min", 60.0), (0.5, 0.5)])
def test_duration(text, expected):
    assert units.parse_duration(text) == pytest.approx(expected)


@pytest.mark.parametrize("text,expected", [("$2.99/h", 2.99), ("2.99", 2.99), ("$0.01/min", 0.6), (0, 0.0)])
def test_price(text, expected):
    assert units.parse_price_per_hour(text) == pytest.approx(expected)


@pytest.mark.parametrize("text,expected", [("4/s", 4.0), ("240/min", 4.0), ("3 rps", 3.0)])
def test_rate(text, expected):
    assert units.parse_rate(text) == pytest.approx(expected)


@pytest.mark.parametrize(
    "parser,text",
    [(units.parse_bytes, "80 parsecs"), (units.parse_bandwidth, "10G"), (units.parse_duration, "soon"), (units.parse_price_per_hour, "85 cents")],
)
def test_bad_units_say_what_is_accepted(parser, text):
    with pytest.raises(units.UnitError, match="write e.g."):
        parser(text)
