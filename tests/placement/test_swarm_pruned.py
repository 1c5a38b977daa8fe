"""heuristics.swarm computes max flows in order of each layout's stage-cut bound and stops early:
it must return the layout that computing every one returns (the first of the largest flows)."""

from __future__ import annotations

import random

from hetcompile.placement import heuristics
from hetcompile.placement.evaluate import helix_flow
from hetcompile.placement.tables import group_tables

from .util import problem


def every_layout(p, tables, partial):
    """The loop swarm ran before it pruned: every stage count's max flow, in order."""
    L, n = p.num_layers, sum(t.count for t in tables)
    best = ([], 0.0)
    for stages in range(-(-L // max(t.kmax for t in tables)), min(L, n) + 1):
        units = heuristics.swarm_layout(p, tables, stages)
        val, _ = helix_flow(p, units, partial=partial)
        if val > best[1] * (1 + 1e-12):
            best = (units, val)
    return best


def random_case(rng: random.Random):
    """2-4 groups over 1-3 regions (slow links between them in half the cases), L 6-12."""
    L = rng.randint(6, 12)
    regions = ["r0", "r1", "r2"][: rng.randint(1, 3)]
    groups = []
    for g in range(rng.randint(2, 4)):
        K = rng.randint(2, L)
        T = sorted((rng.uniform(5, 200) for _ in range(K)), reverse=True)
        groups.append((f"G{g}", rng.choice(regions), rng.randint(1, 6), 1, {1: T}))
    return problem(groups, L, inter_bw=rng.choice([1e12, 60.0, 300.0]))


def test_pruned_swarm_equals_every_layout(monkeypatch):
    rng = random.Random(0)
    for case in range(60):
        p = random_case(rng)
        tables = group_tables(p, split=False)
        for partial in (False, True):
            units, val = heuristics.swarm(p, tables, partial)
            ref_units, ref_val = every_layout(p, tables, partial)
            assert val == ref_val and units == ref_units, f"case {case}, partial {partial}"
    # the bound must prune somewhere, or the test above compares the same loop with itself
    calls, layouts = [], 0
    real = heuristics.helix_flow
    monkeypatch.setattr(heuristics, "helix_flow", lambda *a, **k: calls.append(1) or real(*a, **k))
    for _ in range(20):
        p = random_case(rng)
        tables = group_tables(p, split=False)
        heuristics.swarm(p, tables)
        layouts += min(p.num_layers, sum(t.count for t in tables)) + 1 - -(-p.num_layers // max(t.kmax for t in tables))
    assert len(calls) < layouts
