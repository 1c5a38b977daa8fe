"""Percentile SLOs and headroom (perf/tail.py) and their use in profile/compose/plan, checked by simulation."""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np

import pytest

from conftest import build
from hetcompile.perf import analytic, capacity, catalog, tail


def _rm(model: str, gpu: str, tp: int, d: int = 1):
    _, _, a = catalog.lookup_model(model)
    g = catalog.lookup_gpu(gpu)
    e = analytic.perf_entry(model, a, 2, g, tp, 0.9, 4096)
    part = analytic.balanced_partition(e, a.layers, d, 4096)
    stages = [(g, tp, k, analytic.stage_kv_tokens(e, k, i == 0, i == d - 1)) for i, k in enumerate(part)]
    return analytic.replica_model(a, 2, stages, 1e-4, 10e9, 256)


def test_tail_capacity_meets_targets_and_keeps_headroom() -> None:
    rm = _rm("llama-3-70b", "L40S", 2, 3)
    full = capacity.chain_capacity(rm, 763, 232)
    est = tail.tail_capacity(rm, 763, 232, 0.99, 2.0, 0.15)
    assert 0 < est.requests_per_s < tail.DEFAULT_MAX_UTILIZATION * full.requests_per_s
    assert est.tpot_s <= 0.15 + 1e-12 and est.ttft_s <= 2.0 + 1e-9
    assert full.tpot_s > 0.15  # the unconstrained replica would miss the TPOT target
    # the estimate is the tail model's own point at that load
    p = tail.tail_at_load(rm, 763, 232, est.requests_per_s, 0.99)
    assert p.tpot_s == pytest.approx(est.tpot_s) and p.ttft_s == pytest.approx(est.ttft_s)


def test_without_targets_the_headroom_binds() -> None:
    rm = _rm("llama-3-8b", "A100", 1)
    full = capacity.chain_capacity(rm, 763, 232)
    est = tail.tail_capacity(rm, 763, 232, max_utilization=0.7)
    assert est.binding == "headroom" and est.requests_per_s == pytest.approx(0.7 * full.requests_per_s)


def test_higher_percentile_or_tighter_target_gives_less_capacity() -> None:
    rm = _rm("llama-3-70b", "L40S", 2, 3)
    loose = tail.tail_capacity(rm, 763, 232, 0.99, None, 0.2)
    tight = tail.tail_capacity(rm, 763, 232, 0.99, None, 0.13)
    assert 0 < tight.requests_per_s < loose.requests_per_s
    assert tight.binding == "slo-tpot"
    median = tail.tail_capacity(rm, 763, 232, 0.5, None, 0.13)
    assert median.requests_per_s > tight.requests_per_s


def test_percentiles_grow_with_load_and_quantile() -> None:
    rm = _rm("llama-3-8b", "H100", 1)
    tm = tail.TailModel(rm, 2000, 100)
    lo, hi = tm.point(0.3 * tm.h_full, 0.99), tm.point(0.85 * tm.h_full, 0.99)
    assert lo.ttft_s < hi.ttft_s and lo.tpot_s < hi.tpot_s
    assert tm.point(0.85 * tm.h_full, 0.5).ttft_s < hi.ttft_s
    assert math.isinf(tm.point(1.01 * tm.h_full, 0.99).ttft_s)  # past capacity the queue never settles


def test_unmeetable_slo_has_zero_capacity_and_a_reason() -> None:
    rm = _rm("llama-3-8b", "L4", 1)
    est = tail.tail_capacity(rm, 500, 200, 0.99, None, 0.03)
    assert est.requests_per_s == 0 and est.binding == "slo-unmeetable"
    assert "TPOT" in est.reason and "target 30 ms" in est.reason


@pytest.mark.parametrize("args", [(0.5, "p50"), (0.99, "p99")])
def test_percentile_name(args) -> None:
    assert tail.percentile_name(args[0]) == args[1]


def test_a_latency_target_without_unit_is_an_error_with_line_and_column(tmp_path) -> None:
    from conftest import ROOT
    from hetcompile.driver import compile_spec
    from hetcompile.errors import HetcompileError

    text = (ROOT / "examples/llama70b-pp/spec.yaml").read_text().replace("slo: {ttft: 2s,", "slo: {ttft: 2,")
    spec = tmp_path / "spec.yaml"
    spec.write_text(text)
    with pytest.raises(HetcompileError) as info:
        compile_spec(spec)
    msg = str(info.value)
    line = next(i for i, l in enumerate(text.splitlines(), 1) if "ttft: 2," in l)
    assert f"spec.yaml:{line}:" in msg and "needs a unit" in msg and "'2s' or '2ms'" in msg


def test_percentile_is_parsed_and_defaults_to_p99(tmp_path) -> None:
    from conftest import ROOT
    from hetcompile.ir.lower import load_problem

    text = (ROOT / "examples/llama70b-pp/spec.yaml").read_text()
    (tmp_path / "a.yaml").write_text(text)
    (tmp_path / "b.yaml").write_text(text.replace("tpot: 170ms}", "tpot: 170ms, percentile: p90}"))
    a, b = load_problem(tmp_path / "a.yaml")[0], load_problem(tmp_path / "b.yaml")[0]
    assert [w.slo_quantile for w in a.workloads if w.name == "chat"] == [0.99]
    assert [w.slo_quantile for w in b.workloads if w.name == "chat"] == [0.9]
    assert a.max_utilization == 0.85


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
    assert chat["slo"]["simulated_ttft_s"] <= chat["slo"]["ttft_s"] and chat["slo"]["simulated_attainment"] >= 0.99
    assert plan["verification"]["rounds"] >= 1 and plan["verification"]["seed"] == 0
    assert "| chat | p99 | 2 |" in (tmp_path / "plan.md").read_text()


# --- the done-criterion: the simulator replays the plan at its planned load --------------

@pytest.mark.parametrize("spec", ["tests/data/slo-8b.yaml", "examples/llama70b-pp/spec.yaml"])
def test_planned_load_meets_the_slo_in_simulation(spec: str, tmp_path) -> None:
    """Build a plan with SLOs, replay Poisson arrivals at the planned rates (hetcompile simulate),
    and check the simulated p99 TPOT and TTFT of every SLO workload against its targets. slo-8b
    is sized by its TPOT target, llama70b-pp's chat by its TTFT target (queueing)."""
    from conftest import ROOT
    from hetcompile.backends.emit import write
    from hetcompile.plan.io import read_plan_doc
    from hetcompile.simulate import simulate, steady_arrivals

    write(build(ROOT / spec).ir, tmp_path)
    plan = read_plan_doc(tmp_path / "plan.json")
    slo = {w.name: w.slo for w in plan.workloads if w.slo is not None and (w.slo.ttft_s or w.slo.tpot_s)}
    assert slo and all(s.met for s in slo.values())
    for seed in (0, 1):
        doc = simulate(plan, steady_arrivals(plan, 300.0, seed), 300.0, seed=seed)
        for w in doc.workloads:
            if w.name not in slo:
                continue
            # the plan's load is served (no backlog), and p99 latencies are within the targets
            assert w.completed == w.arrived and w.throughput_requests_per_s == pytest.approx(w.offered_requests_per_s, rel=0.1)
            assert w.tpot_s.p99 <= slo[w.name].tpot_s, (seed, w)
            assert w.ttft_s.p99 <= slo[w.name].ttft_s, (seed, w)
            assert w.slo_attainment >= 0.99


def test_chat_rag_holds_every_slo_at_p99_for_an_hour_at_the_planned_load(tmp_path) -> None:
    """Issue 18's done-criterion on examples/chat-rag: the built plan, replayed for an hour of
    Poisson arrivals at its planned load with two seeds, keeps every SLO at p99, and the share of
    each workload's requests within both targets is consistent with >= 99%: above 99% less the
    hour's own one-sided 95% sampling margin, 1.645 sqrt(0.01 x 0.99 / n) (0.14 points at n = 14,000;
    the build verifies to the edge of its own confidence bound, so an hour lands on either side of
    99%: rag measured 98.96% with seed 1 after issue 31's kernel step times)."""
    import math

    from conftest import ROOT
    from hetcompile.backends.emit import write
    from hetcompile.plan.io import read_plan_doc
    from hetcompile.simulate import simulate, steady_arrivals

    write(build(ROOT / "examples/chat-rag/spec.yaml").ir, tmp_path)
    plan = read_plan_doc(tmp_path / "plan.json")
    slo = {w.name: w.slo for w in plan.workloads}
    assert set(slo) == {"chat", "rag"} and all(s is not None and s.percentile == "p99" and s.met for s in slo.values())
    assert all(w.predicted is not None and w.predicted.ttft_s and w.predicted.tpot_s for w in plan.workloads)
    for seed in (0, 1):
        doc = simulate(plan, steady_arrivals(plan, 3600.0, seed), 3600.0, seed=seed)
        for w in doc.workloads:
            assert w.completed == w.arrived > 1000
            assert w.ttft_s.p99 <= slo[w.name].ttft_s, (seed, w)
            assert w.tpot_s.p99 <= slo[w.name].tpot_s, (seed, w)
            assert w.slo_attainment >= 0.99 - 1.645 * math.sqrt(0.01 * 0.99 / w.arrived), (seed, w)


def test_every_plan_states_p99_at_the_planned_load_and_keeps_headroom() -> None:
    """Every example plan.json (goldens) has p99 TTFT/TPOT per served workload, and no replica is
    routed more than max_utilization of its full-load capacity."""
    from conftest import ROOT
    from hetcompile.plan.io import read_plan_doc

    golden = ROOT / "tests" / "golden"
    for d in sorted(p for p in golden.iterdir() if (p / "plan.json").exists()):
        plan = read_plan_doc(d)
        for w in plan.workloads:
            if w.served_requests_per_s > 0:
                assert w.predicted is not None and w.predicted.percentile == "p99", (d.name, w.name)
                assert w.predicted.utilization <= plan.max_utilization * (1 + 1e-5), (d.name, w.name)  # 6 digits in plan.json


def test_an_slo_the_simulation_keeps_missing_fails_at_its_line_with_what_would_hold(monkeypatch) -> None:
    """The build's simulation judged against half the targets (so that chat-rag's plan misses them
    whatever the capacity model's calibration) and one plan allowed: the build fails at the missed
    SLO's line, quoting the simulated percentile and the loosest target that plan meets."""
    from conftest import ROOT
    from hetcompile.driver import compile_spec
    from hetcompile.errors import InfeasibleError
    from hetcompile.simulate import verify

    monkeypatch.setattr(verify, "MAX_ROUNDS", 1)
    targets = verify.targets

    def strict(plan):
        return [dataclasses.replace(t, ttft_s=t.ttft_s / 2, tpot_s=t.tpot_s / 2) for t in targets(plan)]

    monkeypatch.setattr(verify, "targets", strict)
    with pytest.raises(InfeasibleError) as info:
        compile_spec(ROOT / "examples/chat-rag/spec.yaml")
    msg, text = str(info.value), (ROOT / "examples/chat-rag/spec.yaml").read_text()
    line = next(i for i, l in enumerate(text.splitlines(), 1) if "slo: {ttft: 2s" in l)
    assert f"chat-rag/spec.yaml:{line}:" in msg and "still missed after 1 plan(s)" in msg
    assert "p99" in msg and "loosen the target to what the plan reaches" in msg


def test_tighten_steps_are_bounded() -> None:
    from hetcompile.simulate.verify import TIGHTEN_MAX, TIGHTEN_MIN, Miss, tighten

    out = tighten([Miss("a", "TTFT", "p99", 10.0, 1.0), Miss("b", "TPOT", "p99", 0.041, 0.040),
                   Miss("b", "TTFT", "p99", 2.0, 1.5), Miss("c", "TTFT", "p99", float("inf"), 1.0)])
    assert out == {"a": TIGHTEN_MIN, "b": 0.75, "c": TIGHTEN_MIN}
    assert tighten([Miss("d", "TPOT", "p99", 0.0401, 0.04)]) == {"d": TIGHTEN_MAX}


def test_replications_widen_the_bound_where_runs_disagree() -> None:
    """Two replications that disagree (one clean, one with 3% outside) give a wider bound than the
    same requests taken as independent samples; runs that agree keep the independent-samples floor."""
    from hetcompile.simulate.verify import Z, share_outside_ucb

    clean, bad = [False] * 1000, [True] * 30 + [False] * 970
    e = 30 / 2000
    iid = e + Z * math.sqrt(e * (1 - e) / 2000)
    assert share_outside_ucb([clean, bad]) > iid + 0.01
    half = [True] * 15 + [False] * 985
    assert share_outside_ucb([half, half]) == pytest.approx(iid)
    assert share_outside_ucb([clean, clean]) == 0.0


def test_tail_factors_bisect_between_held_and_missed() -> None:
    """The verify loop's search: a miss never held shrinks by its step; a workload bracketed by a held
    and a missed share tries the midpoint, and settles on the held one once they are close."""
    from hetcompile.passes.verify import next_factors as _next_factors

    assert _next_factors({}, {}, {"a": 1.0}, {"a": 0.5}) == {"a": 0.5}
    assert _next_factors({"a": 0.5}, {"a": 0.5}, {"a": 1.0}, {}) == {"a": 0.75}
    assert _next_factors({"a": 0.75}, {"a": 0.5}, {"a": 0.75}, {"a": 0.9}) == {"a": 0.625}
    assert _next_factors({"a": 0.74}, {"a": 0.74}, {"a": 0.75}, {}) == {"a": 0.74}
    assert _next_factors({"b": 0.9}, {"a": 1.0, "b": 0.9}, {}, {}) == {"b": 0.9}


def test_tail_factors_follow_each_targets_line_and_stop_when_it_promises_little() -> None:
    """With the rounds' bound ratios (rho: the judged percentile over its target), the search steps
    along a line per target: TTFT in 1 / rho (queueing delay ~ 1 / (1 - load)), TPOT in rho. It
    stops at the held share once the line promises less than the tolerance, and bisects where no
    target's rho grows with the share (noise)."""
    from hetcompile.passes.verify import AIM, BISECT_TOLERANCE, _share_at, next_factors as _next_factors

    # TPOT linear in f: rho = f / 0.8 reaches 1 at 0.8 and AIM at 0.76
    assert _share_at((1.0, (None, 1.25)), (0.9, (None, 1.125)), rho=1.0) == pytest.approx(0.8)
    assert _share_at((1.0, (None, 1.25)), (0.9, (None, 1.125)), rho=AIM) == pytest.approx(0.76)
    # TTFT linear in 1/rho: 1/rho = 2 (1 - f) reaches rho = 1 at f = 0.5; an unbounded rho is 1/rho = 0
    assert _share_at((0.25, (2 / 3, None)), (0.75, (2.0, None)), rho=1.0) == pytest.approx(0.5)
    assert _share_at((0.25, (2 / 3, None)), (1.0, (math.inf, None)), rho=1.0) == pytest.approx(0.5)
    # the smaller share of two targets binds; a rho that does not grow says nothing
    assert _share_at((0.25, (2 / 3, 0.5)), (0.75, (2.0, 0.6)), rho=1.0) == pytest.approx(0.5)
    assert _share_at((0.5, (1.2, None)), (0.6, (1.1, None)), rho=1.0) is None
    # never held: two misses extrapolate (within [0.5, 0.9] of the current share) ...
    ratios = {"a": {1.0: (None, 1.25), 0.9: (None, 1.125)}}
    assert _next_factors({"a": 0.9}, {}, {"a": 0.9}, {"a": 0.9}, ratios) == {"a": 0.76}
    # ... bracketed: the line's step, at most 3/4 of the way up the bracket
    ratios = {"a": {0.5: (0.5, None), 1.0: (math.inf, None)}}  # the line reaches 1 at 0.75 and AIM at ~0.74
    step = _next_factors({"a": 0.5}, {"a": 0.5}, {"a": 1.0}, {}, ratios)["a"]
    assert 0.5 + BISECT_TOLERANCE < step <= 0.875
    # ... and it stops at the held share once the line promises less than the tolerance
    ratios = {"a": {0.8: (None, 0.99), 1.0: (None, 1.3)}}
    assert _next_factors({"a": 1.0}, {"a": 0.8}, {"a": 1.0}, {}, ratios) == {"a": 0.8}
    # no line (rho falls with the share): the midpoint, as without ratios
    ratios = {"a": {0.5: (None, 0.99), 1.0: (None, 0.95)}}
    assert _next_factors({"a": 0.5}, {"a": 0.5}, {"a": 1.0}, {}, ratios) == {"a": 0.75}


def test_two_misses_within_the_noise_take_the_tighten_step_not_their_line() -> None:
    """Two misses whose rho differ by less than NOISE_RISE say more about the simulation's noise than
    about the load: their line would extrapolate far (llama70b-pp's chat, TPOT rho 1.012 at 73% and
    81%: a line to half the share). The tighten step instead; a line that rises more is followed."""
    from hetcompile.passes.verify import NOISE_RISE, TIGHTEN_MIN, next_factors

    flat = {"a": {0.81: (None, 1.0125), 0.73: (None, 1.012)}}
    assert next_factors({"a": 0.73}, {}, {"a": 0.73}, {"a": 0.9}, flat) == {"a": pytest.approx(0.73 * 0.9)}
    steep = {"a": {0.81: (None, 1.3 * (1 + 3 * NOISE_RISE)), 0.73: (None, 1.3)}}  # rho = 1.3 - 2.44 (0.73 - f)
    step = next_factors({"a": 0.73}, {}, {"a": 0.73}, {"a": 0.9}, steep)["a"]
    assert step == pytest.approx(0.73 - (1.3 - 0.95) / (1.3 * 3 * NOISE_RISE / 0.08), abs=1e-6)
    assert TIGHTEN_MIN * 0.73 < step < 0.73 * 0.9  # the line's own step, further than the ratio's


def test_the_judged_bound_is_where_a_target_starts_to_miss() -> None:
    """judged_bound: the smallest target a metric meets at the upper confidence bound; a target
    below it misses alone, one at it holds. Unbounded when too many requests never finish."""
    from hetcompile.simulate.verify import judged_bound, share_outside_ucb

    rng = np.random.default_rng(0)
    runs = [rng.exponential(1.0, 500) for _ in range(4)]
    x = judged_bound(runs, 0.99)
    assert share_outside_ucb([list(r > x) for r in runs]) <= 0.01
    below = max(v for r in runs for v in r if v < x)
    assert share_outside_ucb([list(r > below) for r in runs]) > 0.01
    assert judged_bound([np.array([1.0] * 90 + [math.inf] * 10)], 0.99) == math.inf


def test_a_round_stops_early_only_on_a_miss_beyond_doubt() -> None:
    """The first two replications decide alone only when every workload's share outside its targets
    is above 1 - q at the lower confidence bound: a steady 30% outside does; 0% in one replication
    and 4% in the other (cluster10's first plan, whose p99 comes from a rare excursion) does not,
    nor does a workload too small to be judged alone."""
    from hetcompile.simulate.engine import Request
    from hetcompile.simulate.verify import Targets, missed_beyond_doubt

    t = Targets("w", "queueing", "p99", 0.99, 1.0, None)

    def run(n: int, slow: int) -> list[Request]:
        return [Request(id=i, workload="w", arrival=0.0, input_tokens=8, output_tokens=1, first_token=2.0 if i < slow else 0.5,
                        finish=2.0 if i < slow else 0.5) for i in range(n)]

    assert missed_beyond_doubt([t], {"w": [run(500, 150), run(500, 160)]})
    assert not missed_beyond_doubt([t], {"w": [run(500, 0), run(500, 20)]})
    assert not missed_beyond_doubt([t], {"w": [run(100, 50), run(100, 50)]})  # 200 < 1000 requests for a p99
    assert not missed_beyond_doubt([], {})


def test_a_newer_miss_replaces_a_stale_hold() -> None:
    """Workloads share the budget, so a share that held in one round can miss in a later one (another
    workload's tighter share changed what compose bought): the miss wins, and the workload is
    tightened instead of being held at the stale share (chat-rag's rag, at 100% for 4 rounds)."""
    from hetcompile.passes.verify import _record, next_factors as _next_factors

    held, missed = {}, {}
    _record(held, missed, "rag", 1.0, miss=False)  # round 1: held at 100%
    _record(held, missed, "rag", 1.0, miss=True)  # round 2: missed at 100%
    assert held == {} and missed == {"rag": 1.0}
    assert _next_factors({}, held, missed, {"rag": 0.8}) == {"rag": 0.8}
    _record(held, missed, "rag", 0.8, miss=False)  # held once tightened: bracketed again
    assert held == {"rag": 0.8} and missed == {"rag": 1.0}
    _record(held, missed, "rag", 1.0, miss=False)  # a later hold at the missed share clears the miss
    assert held == {"rag": 1.0} and missed == {}


def test_the_queueing_bound_is_on_by_default_and_checked_by_simulation(tmp_path) -> None:
    """By default (`max_ttft_slowdown: 5`) workloads without an SLO are sized so that their p99 TTFT
    stays within 5x the idle TTFT, the build simulates the plan, and plan.json states the simulated
    p99 of every workload; three-regions' RAG replicas on T4s (17 requests of 30 s each at 85% busy)
    queue for tens of seconds without it. `max_ttft_slowdown: null`: nothing is simulated and the
    replicas are loaded to max_utilization."""
    from conftest import ROOT
    from hetcompile.backends.emit import write
    from hetcompile.driver import compile_spec
    from hetcompile.ir.spec import Spec
    from hetcompile.plan.io import read_plan_doc

    assert Spec.model_fields["max_ttft_slowdown"].default == tail.DEFAULT_TTFT_SLOWDOWN
    src = ROOT / "examples/three-regions/spec.yaml"
    write(compile_spec(src).ir, tmp_path / "out")
    plan = read_plan_doc(tmp_path / "out/plan.json")
    assert plan.max_ttft_slowdown == tail.DEFAULT_TTFT_SLOWDOWN and plan.verification is not None
    assert {w.name for w in plan.verification.workloads} == {"chat", "rag"}
    assert all(v.target == "queueing" and v.ttft_target_s and v.met for v in plan.verification.workloads)
    for w in plan.workloads:
        v = next(v for v in plan.verification.workloads if v.name == w.name)
        assert w.simulated is not None and w.simulated.ttft_s == v.p99_ttft_s <= v.ttft_target_s
    spec = tmp_path / "spec.yaml"
    spec.write_text(src.read_text() + "max_ttft_slowdown: null\n")
    write(compile_spec(spec).ir, tmp_path / "plain")
    plain = read_plan_doc(tmp_path / "plain/plan.json")
    assert plain.max_ttft_slowdown is None
    assert plain.verification is None and all(w.simulated is None for w in plain.workloads)
    assert plain.totals.requests_per_s > plan.totals.requests_per_s


def test_a_repeated_verification_is_the_same_result_without_a_replay(monkeypatch) -> None:
    """verify() remembers its last results by the plan part, targets and seed: the same plan gives
    the same records again without replaying; other targets are another key."""
    from conftest import ROOT
    from hetcompile.plan.io import read_plan_doc
    from hetcompile.simulate import verify

    monkeypatch.setattr(verify, "_RECENT", type(verify._RECENT)())  # empty, whatever ran before
    plan = read_plan_doc(ROOT / "tests/golden/three-regions/plan.json")
    first = verify.verify(plan)
    n = len(verify._RECENT)
    again = verify.verify(plan)
    assert again == first and len(verify._RECENT) == n and again[0] is not first[0]
    other = verify.verify(plan.model_copy(update={"max_ttft_slowdown": 8.0}))
    assert len(verify._RECENT) == n + 1 and other[1] != first[1]


def test_parts_that_share_no_replica_are_replayed_alone_each_as_long_as_it_needs(monkeypatch) -> None:
    """chat-rag routes chat and rag to disjoint replicas: two parts, each replayed alone with its own
    window (chat's shorter: its rate is higher), together fewer requests than the whole plan replayed
    for the slower workload's window; a part's records are those of replaying that part alone. Where
    the parts together exceed the work budget, the plan is replayed whole, as one part."""
    from conftest import ROOT
    from hetcompile.plan.io import read_plan_doc
    from hetcompile.simulate import verify

    monkeypatch.setattr(verify, "_RECENT", type(verify._RECENT)())
    plan = read_plan_doc(ROOT / "tests/golden/chat-rag/plan.json")
    ts = verify.targets(plan)
    parts = verify.parts_of(plan, ts)
    assert [[t.workload for t in pts] for _, pts in parts] == [["chat"], ["rag"]]
    assert not {r.id for r in parts[0][0].replicas} & {r.id for r in parts[1][0].replicas}
    docs, ws, _ = verify.verify(plan)
    v = verify.summary(docs, ws, 1, {})
    assert [p.workloads for p in v.parts] == [("chat",), ("rag",)]
    chat, rag = v.parts
    assert chat.duration_s < rag.duration_s and v.duration_s == rag.duration_s
    assert v.requests == chat.requests + rag.requests
    for p in v.parts:  # each workload measured at least as often as its percentile needs
        assert p.requests >= verify.VERIFY_REQUESTS
    whole = verify._replicate(verify.part_of(plan, {t.workload for t in ts}), ts, verify.VERIFY_SEED)
    assert v.requests < sum(w.arrived for d in whole[0] for w in d.workloads)
    alone = verify.verify(parts[0][0])
    assert alone[1] == [w for w in ws if w.name == "chat"] and alone[0] == docs[:len(alone[0])]
    # the parts together above the work budget: the whole plan, one part
    monkeypatch.setattr(verify, "VERIFY_MAX_REQUESTS", int(sum(verify.natural_requests(p, pts) for p, pts in parts)) - 1)
    docs, ws, _ = verify.verify(plan)
    assert [p.workloads for p in verify.summary(docs, ws, 1, {}).parts] == [("chat", "rag")]


def test_parts_sharing_a_prefill_replica_are_one_part() -> None:
    """pd-rag: chat on r7, rag on r8-r10 with a P/D group prefilling on r0-r6: two parts. Give chat a
    group that prefills on r0 too and their queues meet there: the plan is one part. A budget the
    parts exceed gives one part as well."""
    from conftest import ROOT
    from hetcompile.plan.io import read_plan_doc
    from hetcompile.simulate import verify

    plan = read_plan_doc(ROOT / "tests/golden/pd-rag/plan.json")
    ts = verify.targets(plan)
    assert [[t.workload for t in pts] for _, pts in verify.parts_of(plan, ts)] == [["chat"], ["rag"]]
    assert [[t.workload for t in pts] for _, pts in verify.parts_of(plan, ts, budget=verify.VERIFY_REQUESTS)] == [["chat", "rag"]]
    g = plan.groups[0]
    chat = g.model_copy(update={"id": "chat-pd0", "workload": "chat", "prefill": {"r0": 1.0}, "decode": {"r7": 1.0}})
    shared = plan.model_copy(update={"groups": (*plan.groups, chat)})
    assert [[t.workload for t in pts] for _, pts in verify.parts_of(shared, ts)] == [["chat", "rag"]]


def test_one_part_where_workloads_share_a_replica() -> None:
    """three-regions routes chat and rag both to r0: their queues meet there, one part."""
    from conftest import ROOT
    from hetcompile.plan.io import read_plan_doc
    from hetcompile.simulate import verify

    plan = read_plan_doc(ROOT / "tests/golden/three-regions/plan.json")
    assert [[t.workload for t in pts] for _, pts in verify.parts_of(plan, verify.targets(plan))] == [["chat", "rag"]]


def test_replications_in_processes_give_the_same_verification(monkeypatch) -> None:
    """`build -j N` runs the verification's replications in N processes: each is a pure function
    of its seed, so the records are the same, in the same order, as run one after another."""
    from conftest import ROOT
    from hetcompile.plan.io import read_plan_doc
    from hetcompile.simulate import verify

    plan = read_plan_doc(ROOT / "tests/golden/three-regions/plan.json")
    ts = verify.targets(plan)
    part = verify.part_of(plan, {t.workload for t in ts})
    assert verify._replicate(part, ts, 0, workers=2) == verify._replicate(part, ts, 0, workers=1)


def test_a_slowdown_of_one_or_less_is_an_error_at_its_line(tmp_path) -> None:
    from conftest import ROOT
    from hetcompile.driver import compile_spec
    from hetcompile.errors import HetcompileError

    spec = tmp_path / "spec.yaml"
    text = (ROOT / "examples/three-regions/spec.yaml").read_text() + "max_ttft_slowdown: 1\n"
    spec.write_text(text)
    with pytest.raises(HetcompileError) as info:
        compile_spec(spec)
    assert f"spec.yaml:{len(text.splitlines())}:" in str(info.value) and "max_ttft_slowdown" in str(info.value)
