"""Mixed placement never serves less than the single-type plan for the same spec (issue 17).

`placement.pipelines: mixed` re-places each model over the nodes compose chose and keeps the
placed chains only where they serve a larger multiple theta of the demand mix. The case below
failed before: llama-3.1-70b on 8 single-L4 nodes. compose fits it as an 8-stage pipeline
(embedding on the first stage, head on the last); placement's analytic memory rule charges both to
every stage, so no chain holds 80 layers on these nodes and compose's replica was dropped as
"too many layers" - the mixed plan served nothing (0x, no nodes; emitting it then failed in
skypilot.router_task) where single-type serves 0.186x.
bench/mixed_vs_single.py measures the same property on the 1,072-node spec.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hetcompile.backends.emit import artifacts
from hetcompile.driver import compile_spec
from hetcompile.ir.problem import Replica, Stage
from hetcompile.passes.place import measured_misfit

SPEC = """\
name: l4-70b
models: [{{name: llama-3.1-70b}}]
workloads:
  - {{name: chat, model: llama-3.1-70b, input_tokens: 763, output_tokens: 232, share: 70%}}
  - {{name: rag, model: llama-3.1-70b, input_tokens: 2400, output_tokens: 300, share: 30%}}
regions:
  - name: k8s
    cloud: kubernetes
    offers:
      - {{gpu: L4, gpus_per_node: 1, max_nodes: 8}}
network:
  intra_region: {{bandwidth: 25Gbps, latency: 0.5ms}}
budget: $10/h
objective: max-throughput
solver: {{time_limit: 60s, threads: 1, seed: 0}}
placement: {{pipelines: {mode}}}
max_ttft_slowdown: null  # a property of placement: the two builds' verifications would search their own tail factors
"""


def build(tmp_path: Path, mode: str):
    d = tmp_path / mode
    d.mkdir()
    (d / "spec.yaml").write_text(SPEC.format(mode=mode))
    ir = compile_spec(d / "spec.yaml").ir
    return ir, json.loads(artifacts(ir)["plan.json"]), artifacts(ir)["plan.md"]


def test_mixed_never_serves_less_than_single_type(tmp_path):
    single, plan_s, _ = build(tmp_path, "single-type")
    mixed, plan_m, md = build(tmp_path, "mixed")
    assert single.composition.scale > 0.05  # the single-type plan serves something worth keeping
    assert mixed.composition.scale >= single.composition.scale * (1 - 1e-6)
    # at no higher cost, on the same replicas: the chains did not beat them, so compose's stay
    assert sum(n.price_per_s for n in mixed.nodes) <= sum(n.price_per_s for n in single.nodes) * (1 + 1e-9)
    assert [r.stages for r in mixed.replicas] == [r.stages for r in single.replicas]
    (pl,) = plan_m["placement"]
    assert pl["kept"] == "compose"
    # the same figure from two HiGHS solves (place's rate LP on compose's estimates, compose's MILP),
    # written with 6 significant digits: equal to within those digits and the solver's tolerance
    assert pl["scale_single_type"] == pytest.approx(single.composition.scale, rel=1e-5)
    assert pl["scale_placement"] <= pl["scale_single_type"]
    assert "Kept compose's replicas" in md  # plan.md says which replicas were kept, and why
    # the plan keeps compose's bound: it deploys compose's replicas as they are
    assert plan_m["totals"]["bound"] == pytest.approx(plan_s["totals"]["bound"])


def test_only_a_measured_layer_profile_rules_a_replica_out(tmp_path):
    """measured_misfit: a stage over a measured profile's layer count is out; a stage with no
    measured profile (the analytic model, which compose already applied) is not."""
    (tmp_path / "s").mkdir()
    (tmp_path / "s" / "spec.yaml").write_text(SPEC.format(mode="mixed").replace(
        "placement: {pipelines: mixed}",
        "placement:\n  pipelines: mixed\n  layer_profiles:\n    - {model: llama-3.1-70b, gpu: L4, tp: 1, throughput: [10, 9, 8],"
        " kv_token_layers: [9e5, 8e5, 7e5], decode_time: [[1, 5ms], [256, 9ms]], prefill_time: [[1, 20ms], [4096, 40ms]]}"))
    ir = compile_spec(tmp_path / "s" / "spec.yaml", stop_after="compose").ir

    def rep(gpu: str, layers: int) -> Replica:
        stages = tuple(Stage(node=f"n{i}", gpu=gpu, region="k8s", tp=1, layer_start=i * layers, layer_end=(i + 1) * layers)
                       for i in range(80 // layers))
        return Replica(id="r0", model="llama-3.1-70b", shape="s", stages=stages, dtype="bfloat16",
                       estimate=ir.shapes[0].estimate)

    assert measured_misfit(ir, rep("L4", 4))  # 4 layers on an L4 stage, the profile holds 3
    assert not measured_misfit(ir, rep("A100", 4))  # no measured profile for A100: compose's rule stands
