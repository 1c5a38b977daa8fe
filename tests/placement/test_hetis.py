"""Hetis primary-worker selection (placement/hetis.py) against brute force on small groups.

The oracle shares no code with the module: it enumerates every layer split for the dense cost
C(n), and every sequence of single-unit removals that satisfies (Δ) for the selection. Hetis's
criterion, searched exhaustively, is: of the sets reachable by (Δ)-removals where no further
removal satisfies (Δ), the one with the fewest units of the lowest-end type, then the next type,
and so on up to the highest type (whose units are what the dense work runs on), then the lowest
dense cost (lowest end first, §4.1).
"""

from __future__ import annotations

import itertools
import math
import random

import pytest

from hetcompile.placement import hetis
from hetcompile.placement.hetis import UnitType


def brute_cost(types, counts, L):
    best = math.inf
    caps = [n * t.max_layers if n > 0 else 0 for t, n in zip(types, counts)]
    for ls in itertools.product(*(range(c + 1) for c in caps)):
        if sum(ls) != L:
            continue
        v = max((l * t.cost / n for l, t, n in zip(ls, types, counts) if l > 0), default=0.0)
        best = min(best, v)
    return best


def brute_select(types, L, delta):
    order = sorted(range(len(types)), key=lambda i: (types[i].power, types[i].name))
    start = tuple(t.count for t in types)
    cost = {}

    def C(n):
        if n not in cost:
            cost[n] = brute_cost(types, n, L)
        return cost[n]

    if not math.isfinite(C(start)):
        return start
    seen, frontier, stable = {start}, [start], []
    while frontier:
        n = frontier.pop()
        moved = False
        for i in range(len(types)):
            if n[i] == 0:
                continue
            m = n[:i] + (n[i] - 1,) + n[i + 1:]
            if C(m) < (1 + delta) * C(n):
                moved = True
                if m not in seen:
                    seen.add(m)
                    frontier.append(m)
        if not moved:
            stable.append(n)
    # fewest units of the lowest-end type, then the next, ... (not the highest type), then lowest C
    return min(stable, key=lambda n: (*(n[i] for i in order[:-1]), C(n)))


def random_group(rng):
    T = rng.randint(1, 3)
    types = []
    for i in range(T):
        power = rng.choice([65, 121, 181, 312, 989]) * (1 + i * 1e-3)
        types.append(UnitType(f"g{i}", rng.randint(0, 4), cost=1000.0 / power * rng.uniform(0.8, 1.2),
                              max_layers=rng.randint(1, 6), power=power))
    return types, rng.randint(2, 10)


@pytest.mark.parametrize("seed", range(300))
def test_dense_cost_is_the_exhaustive_min_max_mapping(seed):
    types, L = random_group(random.Random(seed))
    counts = [t.count for t in types]
    assert hetis.dense_cost(types, counts, L) == pytest.approx(brute_cost(types, counts, L))
    ls = hetis.stage_layers(types, counts, L)
    if math.isfinite(brute_cost(types, counts, L)):
        assert sum(ls) == L
        assert all(l <= n * t.max_layers for l, t, n in zip(ls, types, counts))
        assert max((l * t.cost / n for l, t, n in zip(ls, types, counts) if l), default=0) == pytest.approx(
            brute_cost(types, counts, L))


@pytest.mark.parametrize("seed", range(300))
def test_selection_is_the_exhaustive_optimum_of_the_criterion(seed):
    rng = random.Random(1000 + seed)
    types, L = random_group(rng)
    delta = rng.choice([0.0, 0.02, 0.05, 0.1, 0.3])
    sel = hetis.select(types, L, delta)
    assert sel.kept == brute_select(types, L, delta)
    # every kept unit adds at least delta (a fixed point of the criterion)
    for i, k in enumerate(sel.kept):
        if k and math.isfinite(sel.cost):
            less = list(sel.kept)
            less[i] -= 1
            assert hetis.dense_cost(types, less, L) >= (1 + delta) * sel.cost * (1 - 1e-12)


@pytest.mark.parametrize("seed", range(200))
def test_the_sweep_for_large_groups_reaches_a_fixed_point(seed):
    rng = random.Random(5000 + seed)
    types, L = random_group(rng)
    delta = rng.choice([0.02, 0.05, 0.1])
    sweep = hetis.select(types, L, delta, exact_limit=0)
    if not math.isfinite(sweep.cost):
        return
    for i, k in enumerate(sweep.kept):
        if k:
            less = list(sweep.kept)
            less[i] -= 1
            assert hetis.dense_cost(types, less, L) >= (1 + delta) * sweep.cost * (1 - 1e-12)
    # each step of the path satisfied (Δ), and the path ends where it says
    assert all(r.after < (1 + delta) * r.before for r in sweep.removals)
    assert hetis.dense_cost(types, sweep.kept, L) == pytest.approx(sweep.cost)


def test_a_low_end_gpu_that_adds_little_is_left_out():
    # 2 units of a 989-TFLOP type and 1 of a 65-TFLOP type, 80 layers that all fit the big ones:
    # the small one carries 80 * (65/989) / (2 + 65/989) ~ 2.5 layers' worth: about 3% of the cost
    big = UnitType("H100", 2, cost=1 / 989, max_layers=60, power=989)
    small = UnitType("T4", 1, cost=1 / 65, max_layers=10, power=65)
    sel = hetis.select([big, small], 80, 0.05)
    assert sel.kept == (2, 0)
    assert sel.removed() == {"T4": 1}
    assert 0 < sel.raise_by_type()["T4"] < 0.05
    assert hetis.select([big, small], 80, 0.0).kept == (2, 1)  # delta 0: nothing goes


def test_kv_filter_keeps_the_units_the_model_needs():
    # the big units cannot hold the model alone: the small one stays whatever it adds
    big = UnitType("H100", 1, cost=1 / 989, max_layers=70, power=989)
    small = UnitType("T4", 1, cost=1 / 65, max_layers=10, power=65)
    sel = hetis.select([big, small], 80, 0.5)
    assert sel.kept == (1, 1)


def test_grouping_divides_types_evenly():
    assert hetis.divide([5, 2, 0], 2) == [(3, 1, 0), (2, 1, 0)]
    types = [UnitType("A", 4, 1 / 312, 40, 312), UnitType("T4", 4, 1 / 65, 8, 65)]
    cs = hetis.select_cluster(types, 32, 0.05)
    assert cs is not None and cs.configs_tried == 4  # k = 5.. would leave an instance empty
    assert sum(sum(s.kept) for s in cs.instances) <= 8


def test_tp_pp_prefers_the_cheaper_split():
    # TP costs a fixed 1 ms per layer here: pure PP wins
    t, pp, time = hetis.tp_pp(4, 8, lambda tp: 1.0 / tp + (1e-3 if tp > 1 else 0.0))
    assert (t, pp) == (1, 4) and time == pytest.approx(2.0)
