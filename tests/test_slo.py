"""SLO sizing (perf/capacity.py slo_capacity) and its use in profile/compose/plan."""

from __future__ import annotations

import json
import math

import pytest

from hetcompile.perf import analytic, capacity, catalog


def _rm(model: str, gpu: str, tp: int, d: int = 1):
    _, _, a = catalog.lookup_model(model)
    g = catalog.lookup_gpu(gpu)
    e = analytic.perf_entry(model, a, 2, g, tp, 0.9, 4096)
    part = analytic.balanced_partition(e, a.layers, d, 4096)
    stages = [(g, tp, k, analytic.stage_kv_tokens(e, k, i == 0, i == d - 1)) for i, k in enumerate(part)]
    return analytic.replica_model(a, 2, stages, 1e-4, 10e9, 256)


def test_slo_capacity_meets_targets_and_is_below_full_load() -> None:
    rm = _rm("llama-3-70b", "L40S", 2, 3)
    full = capacity.chain_capacity(rm, 763, 232)
    slo = capacity.slo_capacity(rm, 763, 232, 2.0, 0.15)
    assert 0 < slo.requests_per_s < full.requests_per_s
    assert slo.tpot_s <= 0.15 + 1e-12 and slo.ttft_s <= 2.0 + 1e-9
    assert full.tpot_s > 0.15  # the unconstrained replica would miss the TPOT target
    # the p99 bound: TPOT at C + 2.33 sqrt(C) sequences
    c99 = slo.concurrency + capacity.Z99 * math.sqrt(slo.concurrency)
    assert slo.tpot_s == pytest.approx(capacity.chain_capacity(rm, 763, 232, max_concurrency=c99).tpot_s)


def test_slo_capacity_tighter_target_gives_less_capacity() -> None:
    rm = _rm("llama-3-70b", "L40S", 2, 3)
    loose = capacity.slo_capacity(rm, 763, 232, None, 0.2)
    tight = capacity.slo_capacity(rm, 763, 232, None, 0.13)
    assert 0 < tight.requests_per_s < loose.requests_per_s
    assert tight.binding == "slo-tpot"


def test_unmeetable_slo_has_zero_capacity_and_a_reason() -> None:
    rm = _rm("llama-3-8b", "L4", 1)
    slo = capacity.slo_capacity(rm, 500, 200, None, 0.03)
    assert slo.requests_per_s == 0 and slo.binding == "slo-unmeetable"
    assert "TPOT" in slo.reason and "target 30 ms" in slo.reason


def test_ttft_queueing_caps_utilization() -> None:
    rm = _rm("llama-3-8b", "H100", 1)
    est = capacity.chain_capacity(rm, 2000, 100)
    tight = capacity.slo_capacity(rm, 2000, 100, est.ttft_s * 1.5, None)
    assert 0 < tight.utilization < capacity.SLO_MAX_UTILIZATION
    assert tight.ttft_s == pytest.approx(est.ttft_s * 1.5)  # the TTFT target binds exactly


def test_example_plan_reports_slo_met_and_dedicated_replicas(tmp_path) -> None:
    import subprocess
    import sys

    from conftest import ROOT

    subprocess.run([sys.executable, "-m", "hetcompile.cli", "build", "examples/llama70b-pp/spec.yaml", "-q", "-o",
                    str(tmp_path)], cwd=ROOT, check=True, capture_output=True)
    plan = json.loads((tmp_path / "plan.json").read_text())
    chat = next(w for w in plan["workloads"] if w["name"] == "chat")
    assert chat["slo"]["met"] is True
    assert chat["slo"]["predicted_tpot_s"] <= chat["slo"]["tpot_s"]
    assert chat["slo"]["predicted_ttft_s"] <= chat["slo"]["ttft_s"] * (1 + 1e-9)
    # every replica routed chat traffic is a dedicated copy, and serves nothing else
    for r in plan["replicas"]:
        if plan["routing"].get("chat", {}).get(r["id"], 0) > 0:
            assert r["shape"].endswith("|slo:chat")
            assert plan["routing"].get("long", {}).get(r["id"], 0) == 0
    assert "| chat | 2 |" in (tmp_path / "plan.md").read_text()


# --- the done-criterion: the simulator replays the plan at its planned load --------------

@pytest.mark.parametrize("spec", ["tests/data/slo-8b.yaml", "examples/llama70b-pp/spec.yaml"])
def test_planned_load_meets_the_slo_in_simulation(spec: str, tmp_path) -> None:
    """Build a plan with SLOs, replay Poisson arrivals at the planned rates (hetcompile simulate),
    and check the simulated p99 TPOT and TTFT of every SLO workload against its targets. slo-8b
    is sized by its TPOT target, llama70b-pp's chat by its TTFT target (queueing)."""
    from conftest import ROOT
    from hetcompile.backends.emit import write
    from hetcompile.driver import compile_spec
    from hetcompile.plan.io import read_plan_doc
    from hetcompile.simulate import poisson_arrivals, simulate

    write(compile_spec(ROOT / spec).ir, tmp_path)
    plan = read_plan_doc(tmp_path / "plan.json")
    slo = {w.name: w.slo for w in plan.workloads if w.slo is not None and (w.slo.ttft_s or w.slo.tpot_s)}
    assert slo and all(s.met for s in slo.values())
    for seed in (0, 1):
        doc = simulate(plan, poisson_arrivals(plan, 300.0, seed), 300.0, seed=seed)
        for w in doc.workloads:
            if w.name not in slo:
                continue
            # the plan's load is served (no backlog), and p99 latencies are within the targets
            assert w.completed == w.arrived and w.throughput_requests_per_s == pytest.approx(w.offered_requests_per_s, rel=0.1)
            assert w.tpot_s.p99 <= slo[w.name].tpot_s, (seed, w)
            assert w.ttft_s.p99 <= slo[w.name].ttft_s, (seed, w)
            assert w.slo_attainment >= 0.99
