"""perf/tail.mixture_quantile: the q-quantile of the requests a router spreads over replicas.

Checked against its definition evaluated by brute force (P(T > t) = sum_r s_r P_r(T > t), P_r read
off each replica's quantile curve on P_GRID with numpy's searchsorted, t on a fine grid), and on
the edge cases: one replica, a saturated replica, curves that end in inf or NaN.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from hetcompile.perf.tail import P_GRID, mixture_quantile


def _beyond(parts: list[tuple[float, np.ndarray]], t: float) -> float:
    mass = 0.0
    for share, v in parts:
        k = int(np.searchsorted(np.maximum.accumulate(v), t, side="right")) - 1
        mass += share * (1.0 - (P_GRID[k] if k >= 0 else 0.0))
    return mass


def _curve(scale: float, tail: float) -> np.ndarray:
    """Quantiles of a shifted exponential-like latency: scale + tail * -log(1 - p)."""
    return scale + tail * -np.log1p(-np.minimum(P_GRID, 1 - 1e-12))


@pytest.mark.parametrize("q", [0.5, 0.9, 0.99, 0.999])
def test_the_mixture_quantile_solves_its_definition(q: float) -> None:
    parts = [(0.6, _curve(0.1, 0.05)), (0.3, _curve(0.2, 0.2)), (0.1, _curve(0.05, 1.0))]
    t = mixture_quantile(parts, q)
    assert math.isfinite(t)
    # t is the smallest time at which at most 1 - q of the requests take longer (to the bisection's precision)
    assert _beyond(parts, t) <= 1 - q + 1e-12
    assert _beyond(parts, t * (1 - 1e-6)) > 1 - q or _beyond(parts, t * (1 - 1e-6)) == _beyond(parts, t)
    grid = np.linspace(0.0, 20.0, 200_001)
    first = next(x for x in grid if _beyond(parts, x) <= 1 - q)
    assert t == pytest.approx(first, abs=2e-4)


def test_one_replica_is_its_own_quantile() -> None:
    v = _curve(0.3, 0.1)
    k = int(np.searchsorted(P_GRID, 0.99 - 1e-12))
    assert mixture_quantile([(1.0, v)], 0.99) == pytest.approx(v[k])


def test_a_saturated_replica_with_more_than_the_tail_makes_it_unbounded() -> None:
    hot = np.full(len(P_GRID), np.inf)
    assert mixture_quantile([(0.95, _curve(0.1, 0.05)), (0.05, hot)], 0.99) == math.inf
    # with less than 1 - q of the requests it leaves the quantile finite, above the other's q-quantile
    # (where the other replica's own tail plus the saturated share make 1 - q)
    parts = [(0.995, _curve(0.1, 0.05)), (0.005, hot)]
    t = mixture_quantile(parts, 0.99)
    assert math.isfinite(t) and t > mixture_quantile(parts[:1], 0.99)
    assert _beyond(parts, t) <= 0.01 + 1e-12 < _beyond(parts, t * (1 - 1e-3))


def test_a_curve_that_ends_in_nan_reads_as_one_that_ends_in_inf() -> None:
    base = _curve(0.1, 0.3)
    nan, inf = base.copy(), base.copy()
    nan[150:], inf[150:] = np.nan, np.inf
    other = _curve(0.2, 0.05)
    for q in (0.5, 0.9, 0.99):
        assert mixture_quantile([(0.5, nan), (0.5, other)], q) == mixture_quantile([(0.5, inf), (0.5, other)], q)
