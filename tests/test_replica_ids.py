"""Replanning never reuses a replica id for a different deployment: a chain of replans
(`hetcompile build --previous`) where replicas are removed and added again; any id that appears in
two plans of the chain names the same model on the same cloud, region and GPU type, and ids of
retired replicas stay retired (plan.json's next_replica only grows). A reused id would be a reused
cluster name: `sky launch -c <plan>-<id>` would land on the running or retired cluster."""

from __future__ import annotations

import json
from pathlib import Path

from conftest import ROOT
from hetcompile.backends.emit import write
from hetcompile.driver import compile_spec


def _deployment(plan: dict, r: dict) -> tuple:
    nodes = {n["id"]: n for n in plan["nodes"]}
    return (r["model"], tuple((nodes[s["node"]]["cloud"], s["region"], s["gpu"]) for s in r["stages"]))


def test_replans_never_reuse_a_replica_id(tmp_path: Path) -> None:
    specs = [ROOT / "examples/quickstart/spec.yaml", ROOT / "tests/explain_cases/quickstart-budget-cut.yaml",
             ROOT / "examples/quickstart/spec.yaml", ROOT / "tests/explain_cases/quickstart-budget-cut.yaml"]
    plans: list[dict] = []
    prev = None
    for i, spec in enumerate(specs):
        out = tmp_path / f"p{i}"
        write(compile_spec(spec, previous=prev, verify=False).ir, out)  # ids are compose's and place's
        plans.append(json.loads((out / "plan.json").read_text()))
        prev = out / "plan.json"
    seen: dict[str, tuple] = {}
    for i, plan in enumerate(plans):
        ids = [r["id"] for r in plan["replicas"]]
        assert len(set(ids)) == len(ids)
        assert all(int(x[1:]) < plan["next_replica"] for x in ids)
        if i:
            assert plan["next_replica"] >= plans[i - 1]["next_replica"]
            retired = {r["id"] for r in plans[i - 1]["replicas"]} - set(ids)
            # an id is only ever handed out fresh: one not in the previous plan is >= its next_replica
            assert all(int(x[1:]) >= plans[i - 1]["next_replica"] for x in set(ids) - {r["id"] for r in plans[i - 1]["replicas"]})
            assert not retired & {r["id"] for r in plans[i]["replicas"]}
        for r in plan["replicas"]:
            d = _deployment(plan, r)
            assert seen.setdefault(r["id"], d) == d, f"plan {i}: {r['id']} was {seen[r['id']]}, now {d}"
    # the chain did remove and add replicas (else it proves nothing)
    assert {r["id"] for r in plans[0]["replicas"]} != {r["id"] for r in plans[1]["replicas"]}
    assert {r["id"] for r in plans[1]["replicas"]} != {r["id"] for r in plans[2]["replicas"]}
