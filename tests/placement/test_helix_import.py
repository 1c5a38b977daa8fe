"""The Helix setups load with Helix's own numbers, units quirk included, and its flows reproduce."""

from __future__ import annotations

import pytest

from hetcompile.placement.helix.baselines import evaluate_placement
from hetcompile.placement.helix.artifact import SETUPS, helix_layout, load_setup, reference
from hetcompile.placement.verify import verify_result


def test_setups_have_the_artifact_composition():
    counts = {name: sum(g.count for g in load_setup(name).groups) for name in SETUPS}
    assert counts == {"single24": 24, "geo24": 24, "highhet42": 42, "cluster10": 10}
    p = load_setup("highhet42")
    t4x4 = next(g for g in p.groups if g.id_prefix.startswith("t4x4"))
    assert sorted(pr.tp for pr in t4x4.profiles) == [1, 2, 4]  # native TP 4, splits into T4x2 / T4 stages
    assert t4x4.native.max_layers == 18


def test_units_quirk_mbps_value_is_bytes_per_second():
    p = load_setup("single24")
    # '1000 * mbps' is used as 1e9 bytes/s: source link = 1e9 / 2-byte tokens (visible in the LP files)
    assert p.edge_capacity("source", "n0") == pytest.approx(5e8)
    assert p.edge_capacity("n0", "n1") == pytest.approx(1e9 / 16384)
    geo = load_setup("geo24")
    assert geo.edge_capacity("n0", "n1") == pytest.approx(1323e6 / 16384)  # [0, 1, 1323.0, 1.0]
    assert geo.link("n0", "n1").latency == pytest.approx(1e-3)


# (setup, layout) -> the artifact's recorded / derived no-partial max flow
FLOWS = {
    ("single24", "helix"): 1289.5557702751735,
    ("single24", "swarm"): 757.8531857227841,
    ("single24", "petals"): 531.7025845523623,
    ("geo24", "helix"): 1212.1768454598214,
    ("geo24", "swarm"): 616.455078125,
    ("highhet42", "helix"): 4137.547585397642,
    ("highhet42", "swarm"): 4892.242429600681,
    ("cluster10", "helix"): 286.5874097546421,
}


@pytest.mark.parametrize("key", sorted(FLOWS))
def test_artifact_layouts_reproduce_their_flows(key):
    name, which = key
    res = evaluate_placement(load_setup(name), helix_layout(name, which))
    assert res.helix_flow == pytest.approx(FLOWS[key], rel=1e-7)
    assert verify_result(res) == pytest.approx(res.helix_flow)


def test_partial_inference_flow_of_petals_matches_derived_value():
    derived = reference()["derived_not_in_artifact"]["flows"]["single_llama70b/petals"]["partial"]
    res = evaluate_placement(load_setup("single24"), helix_layout("single24", "petals"), partial=True)
    assert res.helix_flow == pytest.approx(derived, rel=1e-7)


def test_reference_keeps_attribution():
    art = reference()["artifact"]
    assert "Apache-2.0" in art["license"] and "Helix" in art["paper"]
