"""Timeouts return the best incumbent with an honest gap; binding links are respected."""

from __future__ import annotations

import pytest

from hetcompile.placement import SolverOptions, place
from hetcompile.placement.helix.baselines import swarm
from hetcompile.placement.helix.artifact import load_setup
from hetcompile.placement.verify import verify_result

from .util import problem


def test_tiny_time_limit_keeps_the_heuristic_incumbent():
    p = load_setup("highhet42")
    res = place(p, mode="shared", options=SolverOptions(time_limit_s=0.5, mip_gap=1e-4))
    assert res.helix_flow >= swarm(p).helix_flow * (1 - 1e-9) > 0
    assert res.bound is not None and res.gap is not None and res.bound >= res.helix_flow
    assert res.incumbent_source != "none"
    assert verify_result(res) == pytest.approx(res.helix_flow)


def test_slow_inter_region_links_bind():
    groups = [("A", "r0", 2, 1, {1: [100, 60, 35]}), ("B", "r1", 2, 1, {1: [100, 60, 35]})]
    fast = problem(groups, L=6)
    slow = problem(groups, L=6, inter_bw=10.0)  # 10 tokens/s per node pair between regions
    a = place(fast, mode="shared", options=SolverOptions(time_limit_s=5))
    b = place(slow, mode="shared", options=SolverOptions(time_limit_s=5))
    assert b.helix_flow < a.helix_flow
    assert verify_result(b) == pytest.approx(b.helix_flow)
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


def test_shared_depth_aware_survives_float_residuals():
    """networkx's dinitz raised KeyError('source') on this placement (a 1e-15 float residual);
    the evaluator now runs every max-flow algorithm on integer capacities."""
    from hetcompile.placement.evaluate import flow_algorithms, flow_graph, helix_flow, integer_graph, shared_depth_aware
    from hetcompile.placement.result import StageUnit

    groups = [("G0", "r1", 3, 1, {1: [65.65733658827952, 45.255958672519945, 12.484170268324196]}),
              ("G1", "r0", 3, 1, {1: [97.51100228832183, 95.32331857588363, 92.8619420379949, 42.40212386455559,
                                      35.156723574375334]}),
              ("G2", "r0", 2, 1, {1: [87.46884491989758, 13.311950444062322, 10.146607505520297]})]
    p = problem(groups, L=6, inter_bw=139.67969991201866)
    layout = [("g0-r1-0", 0, 4, 6), ("g0-r1-1", 0, 1, 4), ("g0-r1-2", 0, 0, 1), ("g1-r0-0", 1, 1, 4),
              ("g1-r0-1", 1, 1, 3), ("g1-r0-2", 1, 3, 5), ("g2-r0-0", 2, 1, 4), ("g2-r0-1", 2, 3, 5)]
    units = [StageUnit(n, n, gi, 1, (0,), a, b) for n, gi, a, b in layout]
    assert shared_depth_aware(p, units) > 0
    value, _ = helix_flow(p, units)
    Gi, q = integer_graph(flow_graph(p, units))
    for algo in flow_algorithms():  # every algorithm agrees with the float max flow to round-off
        import networkx as nx

        v, _ = nx.maximum_flow(Gi, "source", "sink", flow_func=algo)
        assert v * q == pytest.approx(value, rel=1e-9)
