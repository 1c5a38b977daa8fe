"""Timeouts return the best incumbent with an honest gap; binding links are respected."""

from __future__ import annotations

import pytest

from hetcompile.placement import SolverOptions, place
from hetcompile.placement.baselines import swarm
from hetcompile.placement.helix_import import load_setup

from .util import problem


def test_tiny_time_limit_keeps_the_heuristic_incumbent():
    p = load_setup("highhet42")
    res = place(p, mode="shared", options=SolverOptions(time_limit_s=0.5, mip_gap=1e-4))
    assert res.helix_flow >= swarm(p).helix_flow * (1 - 1e-9) > 0
    assert res.bound is not None and res.gap is not None and res.bound >= res.helix_flow
    assert res.incumbent_source != "none"
    assert res.verify() == pytest.approx(res.helix_flow)


def test_slow_inter_region_links_bind():
    groups = [("A", "r0", 2, 1, {1: [100, 60, 35]}), ("B", "r1", 2, 1, {1: [100, 60, 35]})]
    fast = problem(groups, L=6)
    slow = problem(groups, L=6, inter_bw=10.0)  # 10 tokens/s per node pair between regions
    a = place(fast, mode="shared", options=SolverOptions(time_limit_s=5))
    b = place(slow, mode="shared", options=SolverOptions(time_limit_s=5))
    assert b.helix_flow < a.helix_flow
    assert b.verify() == pytest.approx(b.helix_flow)
    # every edge flow respects its link
    for u, v, f in b.edge_flows:
        if u not in ("source", "sink") and v not in ("source", "sink"):
            assert f <= slow.edge_capacity(u, v) * (1 + 1e-9)


def test_bad_arguments_are_rejected():
    p = problem([("A", "r0", 2, 1, {1: [100, 60, 35]})], L=4)
    with pytest.raises(ValueError):
        place(p, mode="pipelines")
    with pytest.raises(ValueError):
        place(p, mode="chains", partial_inference=True)
