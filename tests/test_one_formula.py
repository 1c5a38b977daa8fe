"""One capacity formula (issue 17): placement ranks chains by perf/capacity.py's fast mode on the
chain's step model, and every number the plan reports is the full mode on that same model, which
plan.json carries for every replica (mixed chains included) and the simulator replays."""

from __future__ import annotations

import json
import math
import re

import pytest

from conftest import ROOT
from hetcompile.plan.io import read_plan_doc
from hetcompile.perf import analytic, capacity, catalog
from hetcompile.perf.capacity import chain_capacity, fluid_capacity

GOLDEN = ROOT / "tests" / "golden"
EXAMPLES = sorted(p.name for p in GOLDEN.iterdir() if (p / "plan.json").exists())


@pytest.mark.parametrize("example", EXAMPLES)
def test_every_replica_carries_the_step_model_its_capacity_comes_from(example: str) -> None:
    plan = read_plan_doc(GOLDEN / example)
    ws = {w.name: w for w in plan.workloads}
    for r in plan.replicas:
        assert r.step_model is not None, f"{example}/{r.id}"
        for name, e in r.workloads.items():
            if e.binding.startswith(("slo-", "measured")) or e.capacity_requests_per_s == 0:
                continue  # SLO-capped or measured: another number on purpose, said by its binding
            w = ws[name]
            full = chain_capacity(r.step_model.model(), w.input_tokens, w.output_tokens)
            assert e.capacity_requests_per_s == pytest.approx(full.requests_per_s, rel=2e-5), (example, r.id, name)
            assert e.tpot_s == pytest.approx(full.tpot_s, rel=2e-5)


@pytest.mark.parametrize("example", [e for e in EXAMPLES if e.startswith("helix-")])
def test_placement_reports_the_emitted_capacity_of_each_chain(example: str) -> None:
    """The chain table in plan.json (placement's report) holds the full mode of the replica's own
    step model: the number placement reports for a chain is the capacity the plan emits for it."""
    doc = json.loads((GOLDEN / example / "plan.json").read_text())
    plan = read_plan_doc(GOLDEN / example)
    reps = {r.id: r for r in plan.replicas}
    checked = 0
    for m in plan.placement:
        if m.kept != "placement":
            continue
        ws = [w for w in plan.workloads if w.model == m.model]
        total = sum(w.demand for w in ws)
        i = sum(w.demand * w.input_tokens for w in ws) / total
        o = sum(w.demand * w.output_tokens for w in ws) / total
        for c in m.chains:
            rm = reps[c.replica].step_model.model()
            full = chain_capacity(rm, i, o).requests_per_s * (i + o)
            assert c.capacity_tokens_per_s == pytest.approx(full, rel=2e-5)
            # the search's number is the fast mode of the same model
            fast = fluid_capacity(rm, i, o).decode_tokens_per_s * (1 + i / o)
            assert c.search_capacity_tokens_per_s == pytest.approx(fast, rel=2e-5)
            checked += 1
        assert m.capacity == pytest.approx(sum(c.capacity_tokens_per_s for c in m.chains), rel=1e-5)
    assert checked or not doc["placement"]


@pytest.mark.parametrize("example", EXAMPLES)
def test_scripts_pin_the_step_budget_the_capacity_assumes(example: str) -> None:
    """Every node script passes --max-num-batched-tokens equal to its replica's step-model chunk,
    so vLLM's own per-GPU default (8192 on H100/H200, 2048 elsewhere) cannot change what the
    plan computed with."""
    plan = read_plan_doc(GOLDEN / example)
    for r in plan.replicas:
        scripts = sorted((GOLDEN / example / "vllm" / r.id).glob("node*.sh"))
        assert scripts, f"{example}/{r.id}"
        for sh in scripts:
            flags = re.findall(r"--max-num-batched-tokens (\d+)", sh.read_text())
            assert flags == [str(r.step_model.chunk_tokens)], sh


def test_step_budget_is_never_below_max_num_seqs() -> None:
    """vLLM refuses --max-num-batched-tokens below --max-num-seqs."""
    assert analytic.step_token_budget(256) == analytic.PREFILL_CHUNK
    assert analytic.step_token_budget(4096) == 4096


@pytest.mark.parametrize("model,gpu,tp,pp", [("llama-3.1-8b", "L4", 1, 1), ("llama-3-70b", "L40S", 2, 2),
                                             ("llama-3-70b", "A10G", 4, 3)])
def test_fast_mode_is_the_full_formula_without_lumps_and_waits(model: str, gpu: str, tp: int, pp: int) -> None:
    _, _, arch = catalog.lookup_model(model)
    g = catalog.lookup_gpu(gpu)
    e = analytic.perf_entry(model, arch, 2, g, tp, 0.92, 4096)
    part = analytic.balanced_partition(e, arch.layers, pp, 4096)
    stages = [(g, tp, k, analytic.stage_kv_tokens(e, k, i == 0, i == pp - 1)) for i, k in enumerate(part)]
    rm = analytic.replica_model(arch, 2, stages, 1e-3, 10e9, 256)
    for I, O in ((763, 232), (3000, 200), (128, 512)):
        fast = fluid_capacity(rm, I, O)
        fluid = chain_capacity(rm, I, O, fluid=True)
        assert fast.decode_tokens_per_s == pytest.approx(fluid.decode_tokens_per_s, rel=1e-12)
        assert fast.concurrency == pytest.approx(fluid.concurrency, rel=1e-12)


def test_no_second_capacity_formula() -> None:
    """The formulas that used to sit beside perf/capacity.py are gone."""
    for gone in ("chain_estimate", "decode_step_time", "prefill_time"):
        assert not hasattr(analytic, gone), gone
    src = (ROOT / "hetcompile" / "placement" / "evaluate.py").read_text()
    assert "fluid_capacity(chain_model(" in src
    assert not any(hasattr(capacity, x) for x in ("chain_eval",))


def test_fitted_roofline_reproduces_measured_tables() -> None:
    """A measured layer profile (Helix's tables) runs on the step model through a roofline fitted to
    its tables; on the tables' own points the fit stays close (relative error)."""
    from hetcompile.perf.fit import roofline_from_tables

    dec = ((1.0, 4.4e-3), (8.0, 5.1e-3), (32.0, 7.6e-3), (64.0, 10.4e-3))
    pre = ((128.0, 6e-3), (512.0, 21e-3), (2048.0, 88e-3))
    ctx = 870.0
    cost = roofline_from_tables(dec, pre, ctx)
    for b, t in dec:
        assert cost.time(b, b * ctx, 0.0) == pytest.approx(t, rel=0.15)
    for p, t in pre:
        assert cost.time(p, 0.0, p * p / 2.0) == pytest.approx(t, rel=0.15)
    assert math.isfinite(cost.weights_s) and cost.weights_s > 0
