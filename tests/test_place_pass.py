"""The `place` pass with `placement.pipelines: mixed`: Helix max-flow placement inside `build`.

Small specs with inline layer profiles (T(k) tables as in tests/placement) so that the pass can be
checked against a brute-force optimum, networkx, the engine's rules (one TP per chain, KV = the
minimum over stages) and SkyPilot's own Job Group loader.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import networkx as nx
import pytest

from hetcompile.backends.emit import artifacts
from hetcompile.driver import compile_spec
from hetcompile.errors import BackendError, SpecError
from hetcompile.passes.place import idle_owned, materialize
from hetcompile.passes.place_problem import placement_problem
from hetcompile.placement.evaluate import flow_graph
from hetcompile.placement.problem import SINK, SOURCE
from hetcompile.placement.result import StageUnit

from placement.util import brute_force_chains

# a 5-layer toy model; L4 holds up to 3 layers, T4 up to 2 (the "two-types" case of tests/placement)
SPEC = """\
name: toy-mixed
models:
  - name: toy
    weights: toy/toy
    architecture: {{layers: 5, hidden: 1024, intermediate: 4096, heads: 16, kv_heads: 16, vocab: 32000, max_context: 2048}}
workloads:
  - {{name: chat, model: toy, input_tokens: 200, output_tokens: 100, share: 100%}}
regions:
  - name: pool
    cloud: {cloud}
    offers:
      - {{gpu: L4, gpus_per_node: {l4_gpus}, max_nodes: 2, owned: 2}}
      - {{gpu: T4, max_nodes: 2, owned: 2}}
network:
  intra_region: {{bandwidth: 1GB/s, latency: 1ms}}
placement:
  pipelines: mixed
  objective: {objective}
  layer_profiles:
    - model: toy
      gpu: L4
      tp: 1
      throughput: [100, 60, 35]
      kv_token_layers: [600000, 400000, 200000]
      decode_time: [[1, 5ms], [256, 5ms]]
      prefill_time: [[1, 20ms], [4096, 20ms]]
{extra_profile}    - model: toy
      gpu: T4
      tp: 1
      throughput: [50, 26]
      kv_token_layers: [400000, {t4_kv2}]
      decode_time: [[1, 5ms], [256, 5ms]]
      prefill_time: [[1, 20ms], [4096, 20ms]]
"""

L4X2 = """\
    - model: toy
      gpu: L4
      tp: 2
      throughput: [150, 90, 50]
      kv_token_layers: [1200000, 800000, 400000]
      decode_time: [[1, 4ms], [256, 4ms]]
      prefill_time: [[1, 12ms], [4096, 12ms]]
"""


def write_spec(tmp_path: Path, *, cloud="kubernetes", objective="helix", l4_gpus=1, t4_kv2=200000) -> Path:
    text = SPEC.format(cloud=cloud, objective=objective, l4_gpus=l4_gpus, t4_kv2=t4_kv2,
                       extra_profile=L4X2 if l4_gpus == 2 else "")
    path = tmp_path / "spec.yaml"
    path.write_text(text)
    return path


def pool_problem(ir):
    nodes, replicas = materialize(ir)
    pool = [n for r in replicas for s in r.stages for n in nodes if n.id == s.node] + idle_owned(ir, nodes)
    return placement_problem(ir, "toy", pool)


def test_mixed_placement_equals_brute_force(tmp_path):
    res = compile_spec(write_spec(tmp_path))
    plan = json.loads(artifacts(res.ir)["plan.json"])
    (pl,) = plan["placement"]
    pre = compile_spec(write_spec(tmp_path), stop_after="prune").ir
    best = brute_force_chains(pool_problem(pre))
    assert pl["helix_flow"] == pytest.approx(best, rel=1e-6)
    assert pl["bound"] >= best * (1 - 1e-9)


def test_networkx_agrees_with_the_reported_flow(tmp_path):
    res = compile_spec(write_spec(tmp_path))
    plan = json.loads(artifacts(res.ir)["plan.json"])
    pre = compile_spec(write_spec(tmp_path), stop_after="prune").ir
    pp = pool_problem(pre)
    idx = pp.node_index()
    chains, units = [], []
    for r in plan["replicas"]:
        chain = []
        for s in r["stages"]:
            u = StageUnit(s["node"], s["node"], idx[s["node"]][0], s["tp"], tuple(range(s["tp"])), *s["layers"])
            units.append(u)
            chain.append(u.unit)
        chains.append(chain)
    flow = nx.maximum_flow_value(flow_graph(pp, units, chains), SOURCE, SINK)
    assert flow == pytest.approx(plan["placement"][0]["helix_flow"], rel=1e-9)


def test_chains_have_one_tp_and_the_kv_minimum(tmp_path):
    # T4 KV drops at 2 layers: a chain that puts 2 layers on a T4 is limited there
    res = compile_spec(write_spec(tmp_path, objective="depth-aware", t4_kv2=60000))
    plan = json.loads(artifacts(res.ir)["plan.json"])
    pp = pool_problem(compile_spec(write_spec(tmp_path, objective="depth-aware", t4_kv2=60000), stop_after="prune").ir)
    assert plan["replicas"]
    for r in plan["replicas"]:
        assert len({s["tp"] for s in r["stages"]}) == 1
        assert sum(r["partition"]) == 5
        kv = []
        for s in r["stages"]:
            k = s["layers"][1] - s["layers"][0]
            prof = pp.groups[pp.node_index()[s["node"]][0]].profile(s["tp"])
            kv.append(prof.kv_token_layers[k - 1] / k)
        assert r["kv_capacity_tokens"] == int(min(kv))


def test_mixed_chain_lowers_to_a_job_group_sky_accepts(tmp_path):
    from hetcompile.testing.sky_check import load_job_group

    res = compile_spec(write_spec(tmp_path))
    files = artifacts(res.ir)
    plan = json.loads(files["plan.json"])
    mixed = [r for r in plan["replicas"] if r["mixed"]]
    assert mixed, "the toy pool's best chains mix L4 and T4"
    for r in mixed:
        path = tmp_path / f"{r['id']}.yaml"
        path.write_text(files[f"sky/{r['id']}.yaml"])
        dag = load_job_group(path)
        assert dag.is_job_group() and dag.inter_connection_enabled()
        assert [t.name for t in dag.tasks] == [f"s{k}" for k in range(r["pp"])]
        assert all(f"node{k}.sh" in t.run for k, t in enumerate(dag.tasks))
    assert "sky jobs launch" in files["deploy.sh"] and "sky jobs cancel" in files["teardown.sh"]
    assert "Kubernetes only" in files["plan.md"]


def test_split_node_becomes_tp_slices():
    # helix-highhet42 (pinned by its golden): multi-GPU T4x2/T4x4/L4x2 nodes cut into TP1 slices
    # `<node>-s<j>` so that they join TP1 chains; each slice is its own pod of tp GPUs
    root = Path(__file__).resolve().parent
    plan = json.loads((root / "golden" / "helix-highhet42" / "plan.json").read_text())
    nodes = {n["id"]: n for n in plan["nodes"]}
    stages = [s for r in plan["replicas"] for s in r["stages"]]
    slices = [s for s in stages if re.search(r"-s\d+$", s["node"])]
    assert slices
    assert len({s["node"] for s in stages}) == len(stages)
    for s in slices:
        assert nodes[s["node"]]["gpus"] == s["tp"] == 1
    split = {c for m in plan["placement"] for c in m["chains"] for c in c["split_nodes"]}
    assert {re.sub(r"-s\d+$", "", s["node"]) for s in slices} <= split


def test_mixed_chain_outside_kubernetes_is_a_clear_error(tmp_path):
    path = write_spec(tmp_path, cloud="aws")
    path.write_text(path.read_text().replace("- name: pool", "- name: us-east-1"))  # an AWS region (issue 20)
    res = compile_spec(path)
    with pytest.raises(BackendError, match="Kubernetes only"):
        artifacts(res.ir)


def test_layer_profile_length_mismatch_points_at_the_spec(tmp_path):
    path = write_spec(tmp_path)
    path.write_text(path.read_text().replace("kv_token_layers: [600000, 400000, 200000]", "kv_token_layers: [600000]"))
    with pytest.raises(SpecError) as e:
        compile_spec(path)
    assert "kv_token_layers has 1 entries but throughput has 3" in str(e.value)
    assert "spec.yaml:" in str(e.value)


def test_single_type_default_runs_no_placement(tmp_path):
    path = write_spec(tmp_path)
    path.write_text(path.read_text().replace("pipelines: mixed", "pipelines: single-type"))
    plan = json.loads(artifacts(compile_spec(path).ir)["plan.json"])
    assert not plan["placement"]
    assert not any(r["mixed"] for r in plan["replicas"])


def test_a_build_without_placement_does_not_import_networkx():
    """networkx (the max-flow checks) is imported where placement runs, not at startup: it costs a
    single-type build about 0.5 s of its ~4 s without verification. A fresh interpreter, because this
    one has imported it for other tests."""
    import subprocess
    import sys

    code = ("import sys; from pathlib import Path; from hetcompile.driver import compile_spec; "
            "compile_spec(Path('examples/quickstart/spec.yaml'), verify=False); "
            "print('networkx' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).resolve().parents[1], capture_output=True,
                          text=True, check=True)
    assert proc.stdout.strip() == "False"


def test_unknown_coordinator_region_has_did_you_mean(tmp_path):
    path = write_spec(tmp_path)
    path.write_text(path.read_text().replace("  pipelines: mixed", "  pipelines: mixed\n  coordinator: pol"))
    with pytest.raises(SpecError, match="did you mean 'pool'"):
        compile_spec(path)


def test_rates_lp_matches_a_hand_solution():
    from hetcompile.passes.rates import max_scale
    from hetcompile.opt.solve import SolverOptions

    # r0 serves chat at 4/s or batch at 1/s; r1 only batch at 2/s; demand 1:1
    theta, x = max_scale({"r0": {"chat": 4.0, "batch": 1.0}, "r1": {"batch": 2.0}}, {"chat": 1.0, "batch": 1.0},
                         SolverOptions(), name="t")
    # r1 takes 2/s of batch; r0 splits: theta/4 + (theta - 2)/1 <= 1 -> theta = 2.4
    assert theta == pytest.approx(2.4, rel=1e-6)
    assert sum(v for (r, w), v in x.items() if w == "chat") == pytest.approx(2.4, rel=1e-6)


def test_mixed_replan_never_reuses_a_replica_id(tmp_path):
    """Replanning (`--previous`): a placed chain keeps a running replica's id only on exactly its
    nodes; every other replica takes an id at or above the previous plan's next_replica (the old
    pass numbered chains r0, r1, ... and so gave a retired replica's id, hence its cluster name, to
    a different replica)."""
    from hetcompile.backends.emit import write

    spec = write_spec(tmp_path)
    write(compile_spec(spec).ir, tmp_path / "old")
    prev = json.loads((tmp_path / "old" / "plan.json").read_text())
    prev["next_replica"] = 7
    (tmp_path / "prev.json").write_text(json.dumps(prev))
    ir = compile_spec(spec, previous=tmp_path / "prev.json").ir
    nodes_of = {r["id"]: [s["node"] for s in r["stages"]] for r in prev["replicas"]}
    assert ir.replicas
    for r in ir.replicas:
        if r.id in nodes_of:
            assert [s.node for s in r.stages] == nodes_of[r.id]
        else:
            assert int(r.id[1:]) >= 7
    assert len({r.id for r in ir.replicas}) == len(ir.replicas)


def test_shared_comparison_is_skipped_above_its_pool_size(tmp_path, monkeypatch):
    """compare_shared (default true) runs Helix's shared search on pools up to SHARED_MAX_NODES;
    above, plan.json has no shared figures and the place pass says why."""
    import hetcompile.passes.place as place_pass

    spec = write_spec(tmp_path)
    small = json.loads(artifacts(compile_spec(spec, verify=False).ir)["plan.json"])
    (pl,) = small["placement"]
    assert pl["shared_helix_flow"] is not None
    monkeypatch.setattr(place_pass, "SHARED_MAX_NODES", 3)  # the toy pool has 4 nodes
    ir = compile_spec(spec, verify=False).ir
    (pl,) = json.loads(artifacts(ir)["plan.json"])["placement"]
    assert pl["shared_helix_flow"] is None and pl["shared_bound"] is None
    assert pl["helix_flow"] == small["placement"][0]["helix_flow"]  # the chains are the same search
    (rep,) = [r for r in ir.reports if r.name == "place"]
    assert any("shared pipelines not compared: 4 pool nodes, above the 3" in n for n in rep.notes)
