"""Numbers for people (hetcompile/plan/human.py): SI suffixes, money, plurals, never an exponent."""

from __future__ import annotations

import re

import pytest

from hetcompile.plan import human

EXPONENT = re.compile(r"\d[eE][+-]?\d")


@pytest.mark.parametrize("x, want", [
    (23390.0, "23.4k"), (9.556, "9.56"), (1023.0, "1.02k"), (999.96, "1k"), (2.9e-05, "0.000029"),
    (0.0, "0"), (7.16759e6, "7.17M"), (1.5e9, "1.5G"), (-4.3e-05, "-0.000043"), (None, "-"), (12.0, "12"),
])
def test_si(x, want) -> None:
    assert human.si(x) == want


@pytest.mark.parametrize("x, want", [
    (0.0005, "$0.0005/h"), (0.00075, "$0.00075/h"), (7.0, "$7.00/h"), (0.0, "$0.00/h"), (119.77, "$119.77/h"),
    (1234.5, "$1,234.50/h"), (-2.5, "-$2.50/h"), (None, "-"),
])
def test_money(x, want) -> None:
    assert human.money(x) == want


def test_plural() -> None:
    assert human.plural(1, "replica") == "1 replica"
    assert human.plural(2, "replica") == "2 replicas"
    assert human.plural(0, "node") == "0 nodes"


@pytest.mark.parametrize("x", [1e-9, 3.3e-7, 1e20, 6.55e4, 5.61231e-05, 123456789.0])
def test_no_exponent_anywhere(x) -> None:
    for s in (human.si(x), human.number(x), human.money(x), human.percent(x)):
        assert not EXPONENT.search(s), s
