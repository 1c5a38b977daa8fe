"""End to end on the small Helix setups (fast ones only; the bench runs all four)."""

from __future__ import annotations

import pytest

from hetcompile.placement import SolverOptions, place
from hetcompile.placement.helix.baselines import evaluate_placement
from hetcompile.placement.helix.artifact import helix_layout, load_setup, setup_info
from hetcompile.placement.verify import engine_cost_lines
from hetcompile.placement.verify import summary_lines, verify_result

OPTS = SolverOptions(time_limit_s=20, mip_gap=1e-3)


@pytest.mark.parametrize("name", ["single24", "cluster10"])
def test_shared_reaches_helix_with_a_tight_bound(name):
    p = load_setup(name)
    res = place(p, mode="shared", options=OPTS)
    assert res.helix_flow >= setup_info(name).helix_value * (1 - 1e-9)
    assert res.gap is not None and res.gap <= 1e-3
    assert verify_result(res) == pytest.approx(res.helix_flow)


@pytest.mark.parametrize("name", ["single24", "cluster10"])
def test_depth_aware_chains_beat_the_artifact_layouts(name):
    p = load_setup(name)
    ours = place(p, options=OPTS)  # chains, depth-aware: the deployable default
    verify_result(ours)
    for which in ("helix", "swarm", "petals"):
        try:
            units = helix_layout(name, which, problem=p)
        except KeyError:
            continue
        other = evaluate_placement(p, units)
        assert ours.depth_aware_capacity >= other.depth_aware_capacity * (1 + 1e-4), which


def test_plan_md_lines_state_both_flows():
    p = load_setup("single24")
    shared = place(p, mode="shared", options=OPTS)
    chains = place(p, mode="chains", options=OPTS)
    lines = engine_cost_lines(shared, chains) + summary_lines(chains)
    assert any("engine constraint costs" in x for x in lines)
    assert any("depth" in x and "C = " in x and "bound by" in x for x in lines)
