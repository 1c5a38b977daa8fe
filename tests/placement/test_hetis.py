"""Hetis primary-worker selection (placement/hetis.py) against brute force on small groups.

The oracle shares no code with the module: it enumerates every layer split for the dense cost
C(n), and every subset (count vector n <= N) for the selection. Hetis's criterion, searched
exhaustively: of the sets whose dense cost stays within (1 + delta) of the full group's, the one
with the fewest units of the lowest-end type, then of the next type, and so on (§4.1: lowest end
first).
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
    full = tuple(t.count for t in types)
    bound = brute_cost(types, full, L)
    if not math.isfinite(bound):
        return full
    # the full group is the reference and always admissible (delta 0: nothing else is)
    ok = [full] + [n for n in itertools.product(*(range(c + 1) for c in full)) if brute_cost(types, n, L) < (1 + delta) * bound]
    return min(ok, key=lambda n: tuple(n[i] for i in order))


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
    if not math.isfinite(sel.full_cost):
        return
    assert sel.cost < (1 + delta) * sel.full_cost or not sel.removals
    # every kept unit is needed: without any one of them the criterion fails
    for i, k in enumerate(sel.kept):
        if k:
            less = list(sel.kept)
            less[i] -= 1
            assert not hetis.dense_cost(types, less, L) < (1 + delta) * sel.full_cost
    # the removal path is the paper's: lowest-end type first, each step within the bound
    ranks = {t.name: (t.power, t.name) for t in types}
    assert [ranks[r.type] for r in sel.removals] == sorted(ranks[r.type] for r in sel.removals)
    assert all(r.after < (1 + delta) * sel.full_cost for r in sel.removals)


def test_a_low_end_gpu_that_adds_little_is_left_out():
    # 2 units of a 989-TFLOP type and 1 of a 65-TFLOP type, 80 layers that all fit the big ones:
    # the small one carries 80 * (65/989) / (2 + 65/989) ~ 2.5 layers' worth: about 3% of the cost
    big = UnitType("H100", 2, cost=1 / 989, max_layers=60, power=989)
    small = UnitType("T4", 1, cost=1 / 65, max_layers=10, power=65)
    sel = hetis.select([big, small], 80, 0.05)
    assert sel.kept == (2, 0)
    assert sel.removed() == {"T4": 1}
    assert 0 < sel.raise_by_type()["T4"] < 0.05
    assert sel.cost / sel.full_cost - 1 == pytest.approx(sel.raise_by_type()["T4"])
    assert hetis.select([big, small], 80, 0.0).kept == (2, 1)  # delta 0: nothing goes


def test_removals_do_not_compound_past_delta():
    # 40 equal units: each one is 2.5% of the group, so a step-relative rule would remove all but
    # one; measured against the full group, only 5% of the cost may be given up
    types = [UnitType("L4", 40, cost=1.0, max_layers=80, power=121)]
    sel = hetis.select(types, 80, 0.05)
    assert sel.cost < 1.05 * sel.full_cost
    assert sel.kept == (39,) or sel.kept == (38,)


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


def test_tp_pp_with_more_gpus_than_layers_and_odd_counts():
    t, pp, time = hetis.tp_pp(25, 7, lambda tp: 1.0 / tp)  # 25 GPUs, 7 layers: PP alone would leave 18 idle
    assert t * pp <= 25 and pp <= 7 and math.isfinite(time)
    assert time == pytest.approx(min(math.ceil(7 / min(7, 25 // d)) / d for d in (1, 2, 4, 8, 16)))
