"""Bounds are valid (never below an optimum) and the pattern bound is tight where it should be."""

from __future__ import annotations

import pytest

from hetcompile.placement.helix.bound import PatternBound, fixed_point_bound
from hetcompile.placement.helix.artifact import load_setup
from hetcompile.placement.tables import group_tables

from .util import brute_force_shared, problem


@pytest.mark.parametrize("groups,L", [
    ([("A", "r0", 2, 1, {1: [100, 60, 35]}), ("B", "r0", 2, 1, {1: [50, 26]})], 5),
    ([("A", "r0", 1, 1, {1: [100, 90]}), ("B", "r0", 3, 1, {1: [40, 35]})], 4),
])
def test_bounds_are_valid_on_small_cases(groups, L):
    p = problem(groups, L)
    tables = group_tables(p, split=False)
    opt = brute_force_shared(p)
    fp = fixed_point_bound(tables, L)
    pb = PatternBound(tables, L).bound(0.0, fp).value
    assert opt <= pb * (1 + 1e-9) <= fp * (1 + 1e-6)


def test_pattern_bound_is_tight_on_cluster10():
    # Helix's Gurobi run proved 286.587 optimal (3803 s); the fixed point alone says 340.7
    p = load_setup("cluster10")
    tables = group_tables(p, split=False)
    fp = fixed_point_bound(tables, p.num_layers)
    pb = PatternBound(tables, p.num_layers).bound(0.0, fp, rel_tol=1e-5).value
    assert fp == pytest.approx(340.70, abs=0.05)
    assert 286.5874 <= pb <= 286.5874 * 1.0002


def test_fixed_point_is_exact_for_single24():
    # one 24-stage chain (A100 x 8, L4 x 3, T4 x 2 layers per node) reaches this value
    p = load_setup("single24")
    assert fixed_point_bound(group_tables(p, split=False), 80) == pytest.approx(2045.641047, rel=1e-6)


def test_bounds_and_place_on_random_two_region_clusters():
    """Slow links between regions: the forced-crossing bound stays valid and `place` is optimal."""
    import random

    from hetcompile.placement import SolverOptions, place
    from hetcompile.placement.helix.place import forced_crossing
    from hetcompile.placement.tables import network

    rng = random.Random(7)
    crossing_cases = 0
    for _ in range(8):
        L = rng.choice([4, 5])

        def table(K):
            return sorted((rng.uniform(10, 100) for _ in range(K)), reverse=True)

        groups = [("A", "r0", rng.choice([1, 2]), 1, {1: table(rng.choice([2, 3]))}),
                  ("B", "r1", rng.choice([1, 2]), 1, {1: table(rng.choice([2, 3]))})]
        p = problem(groups, L, inter_bw=rng.uniform(5, 60))
        tables = group_tables(p, split=False)
        crossing = forced_crossing(tables, network(p), L)
        crossing_cases += crossing is not None
        opt = brute_force_shared(p)
        bound = PatternBound(tables, L, crossing).bound(0.0, fixed_point_bound(tables, L), rel_tol=1e-6).value
        res = place(p, mode="shared", options=SolverOptions(time_limit_s=5, mip_gap=1e-6))
        assert opt <= bound * (1 + 1e-7)
        assert res.helix_flow == pytest.approx(opt, rel=1e-6, abs=1e-9)
        assert res.bound >= opt * (1 - 1e-7)
    assert crossing_cases >= 2


def test_forced_crossing_proves_the_geo_optimum():
    from hetcompile.placement.helix.place import forced_crossing
    from hetcompile.placement.tables import network

    p = load_setup("geo24")
    tables = group_tables(p, split=False)
    crossing = forced_crossing(tables, network(p), p.num_layers)
    assert crossing is not None and crossing.pair_cap < 1000
    plain = PatternBound(tables, 80).bound(1700.0, 2045.65, rel_tol=1e-5).value
    forced = PatternBound(tables, 80, crossing).bound(1700.0, 2045.65, rel_tol=1e-5).value
    assert plain == pytest.approx(2045.64, abs=0.1)
    assert forced == pytest.approx(1754.38, abs=0.1)  # = T_A100(9): the segments heuristic reaches it
