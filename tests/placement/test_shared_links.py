"""Shared mode where links bind (region links and per-node links): exact against brute force.

The brute force enumerates every placement (util.brute_force_shared) and takes networkx's max
flow of each, so it is the optimum of the very evaluator `place` reports with. Before the
node-level MILP (placement/helix/milp_nodes.py) the group-count model's pair rows counted placed nodes that
carry no flow and saw only the weakest node pair: it stopped at an "optimum" 20-40% below these.
"""

from __future__ import annotations

import dataclasses
import random

import pytest

from hetcompile.placement import SolverOptions, place
from hetcompile.placement.problem import Link
from hetcompile.placement.verify import verify_result

from .util import brute_force_shared, problem

OPTS = SolverOptions(time_limit_s=30, mip_gap=1e-6)


def random_case(rng: random.Random):
    """2-4 nodes, 3-5 layers, slow links between (and maybe inside) regions, maybe per-node links."""
    L = rng.choice([3, 4, 5])

    def table(K):
        return sorted((rng.uniform(10, 100) for _ in range(K)), reverse=True)

    groups = [(f"G{g}", f"r{rng.randint(0, 1)}", rng.choice([1, 2]), 1, {1: table(rng.choice([2, 3]))})
              for g in range(rng.choice([1, 2]))]
    if sum(g[2] for g in groups) < 2:
        groups.append(("H", "r1", 2, 1, {1: table(3)}))
    p = problem(groups, L, inter_bw=rng.uniform(5, 60), intra_bw=rng.choice([1e12, rng.uniform(5, 80)]))
    if rng.random() < 0.5:
        ids = [i for g in p.groups for i in g.ids]
        links = tuple(Link(a, b, rng.uniform(5, 80), 1e-3) for k, a in enumerate(ids) for b in ids[k + 1:] if rng.random() < 0.5)
        p = dataclasses.replace(p, node_links=links)
    return p


def test_shared_equals_brute_force_with_binding_links():
    rng = random.Random(2)
    for case in range(45):
        p = random_case(rng)
        opt = brute_force_shared(p)
        res = place(p, mode="shared", options=OPTS)
        assert res.helix_flow == pytest.approx(opt, rel=1e-6, abs=1e-9), f"case {case}"
        assert res.bound >= opt * (1 - 1e-7), f"case {case}"
        assert verify_result(res) == pytest.approx(res.helix_flow, rel=1e-9)


def test_per_node_links_faster_than_the_weakest_pair_are_used():
    """Three nodes, one region: the weakest pair (17 tokens/s) would cap a region-level model;
    the optimum (48.07) runs g0 -> h1 over its own 48 tokens/s link."""
    groups = [("G0", "r1", 1, 1, {1: [81.00590525821342, 12.614346577313446]}),
              ("H", "r1", 2, 1, {1: [99.2140646888127, 58.00241666310348, 15.270762880923176]})]
    p = problem(groups, L=4, intra_bw=54.8410277121736)
    p = dataclasses.replace(p, node_links=(
        Link("g0-r1-0", "h-r1-0", 58.37636564947073, 1e-3), Link("g0-r1-0", "h-r1-1", 48.067457414337035, 1e-3),
        Link("h-r1-0", "h-r1-1", 17.17080593493062, 1e-3)))
    res = place(p, mode="shared", options=OPTS)
    assert brute_force_shared(p) == pytest.approx(48.067457414337035, rel=1e-9)
    assert res.helix_flow == pytest.approx(48.067457414337035, rel=1e-6)
    milp = [s for s in res.solves if s.name == "place-shared-nodes-milp"]
    assert milp and milp[0].objective == pytest.approx(res.helix_flow, rel=1e-6)  # objective = realizable flow


def test_two_gpu_nodes_with_a_slow_pair():
    """Multi-GPU nodes (native TP 2) and a binding link: still the enumerated optimum."""
    groups = [("A", "r0", 2, 2, {2: [120, 70, 30]}), ("B", "r1", 1, 1, {1: [60, 25]})]
    p = problem(groups, L=4, inter_bw=15.0)
    res = place(p, mode="shared", options=OPTS)
    assert res.helix_flow == pytest.approx(brute_force_shared(p), rel=1e-6)


def test_segment_search_stops_when_every_probe_fails():
    """Case 51 of seed 0: the segment search bisected from lo = 0 until F underflowed to 0 and
    divided by it (ZeroDivisionError); it now stops at 1e-9 of the bound."""
    rng = random.Random(0)
    for _ in range(52):
        p = random_case(rng)
    res = place(p, mode="shared", options=OPTS)
    assert res.helix_flow == pytest.approx(brute_force_shared(p), rel=1e-6, abs=1e-9)
