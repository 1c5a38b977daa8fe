"""On small clusters `place` equals a brute-force optimum, and networkx agrees with its flow."""

from __future__ import annotations

import pytest

from hetcompile.placement import SolverOptions, place
from hetcompile.placement.verify import verify_result

from .util import brute_force_chains, brute_force_shared, problem

OPTS = SolverOptions(time_limit_s=10, mip_gap=1e-6)

CASES = {
    "two-types": ([("A", "r0", 2, 1, {1: [100, 60, 35]}), ("B", "r0", 2, 1, {1: [50, 26]})], 5),
    "non-monotone": ([("A", "r0", 2, 1, {1: [90, 30, 40]}), ("B", "r0", 2, 1, {1: [45, 20]})], 5),
    "one-type": ([("A", "r0", 3, 1, {1: [80, 45, 20]})], 4),
    "parallel-wins": ([("A", "r0", 1, 1, {1: [100, 90]}), ("B", "r0", 3, 1, {1: [40, 35]})], 4),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_shared_equals_brute_force(case):
    groups, L = CASES[case]
    p = problem(groups, L)
    res = place(p, mode="shared", options=OPTS)
    best = brute_force_shared(p)
    assert res.helix_flow == pytest.approx(best, rel=1e-6)
    assert res.bound >= best * (1 - 1e-9)
    assert verify_result(res) == pytest.approx(res.helix_flow, rel=1e-9)


@pytest.mark.parametrize("case", sorted(CASES))
def test_chains_helix_equals_brute_force(case):
    groups, L = CASES[case]
    p = problem(groups, L)
    res = place(p, mode="chains", objective="helix", options=OPTS)
    best = brute_force_chains(p)
    assert res.helix_flow == pytest.approx(best, rel=1e-6)
    assert res.bound is not None and res.bound >= best * (1 - 1e-9)
    assert verify_result(res) == pytest.approx(res.helix_flow, rel=1e-9)


def test_chains_never_exceed_shared():
    groups, L = CASES["parallel-wins"]
    p = problem(groups, L)
    shared = place(p, mode="shared", options=OPTS)
    chains = place(p, mode="chains", objective="helix", options=OPTS)
    assert chains.helix_flow <= shared.helix_flow * (1 + 1e-9)


def test_partial_inference_is_at_least_as_good():
    groups, L = CASES["non-monotone"]
    p = problem(groups, L)
    plain = place(p, mode="shared", options=OPTS)
    partial = place(p, mode="shared", options=OPTS, partial_inference=True)
    assert partial.partial_inference
    assert partial.helix_flow >= plain.helix_flow * (1 - 1e-9)
    assert verify_result(partial) == pytest.approx(partial.helix_flow, rel=1e-9)
