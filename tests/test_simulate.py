"""The plan simulator: determinism, traces, KV limits and preemption, pipelines, the CLI and
explain, and agreement with the analytic capacity at saturation (perf/capacity.py)."""

from __future__ import annotations

import re

import json
from pathlib import Path

import jsonschema
import pytest
from typer.testing import CliRunner

from conftest import ROOT
from hetcompile.cli import app
from hetcompile.plan.io import read_plan_doc
from hetcompile.perf.capacity import chain_capacity, decode_rate
from hetcompile.perf.stepmodel import Hop, LayerCost, ReplicaModel, StageModel
from hetcompile.simulate import SimulationError, poisson_arrivals, simulate, trace_arrivals
from hetcompile.simulate.capacity_check import capacity_cases
from hetcompile.simulate.engine import Driver, ReplicaSim, Request
from hetcompile.simulate.run import saturation_throughput

GOLDEN = ROOT / "tests" / "golden"
TINY = GOLDEN / "tiny-cpu" / "plan.json"
COST = LayerCost(weights_s=1e-3, kv_s_per_token=1e-8, flop_s_per_token=2e-6, attn_s_per_pair=1e-10)


def _rm(kv: float = 1e6, max_num_seqs: int = 32, depth: int = 1, layers: int = 8, hop: float = 0.0) -> ReplicaModel:
    per = layers // depth
    return ReplicaModel(
        stages=tuple(StageModel(gpu="X", tp=1, layers=per, kv_tokens=kv, cost=COST) for _ in range(depth)),
        hops=tuple(Hop(latency_s=hop, bandwidth=1e12) for _ in range(depth - 1)),
        step_overhead_s=0.002, max_num_seqs=max_num_seqs, chunk_tokens=512,
    )


def test_same_seed_same_bytes_other_seed_differs() -> None:
    plan = read_plan_doc(TINY)
    a = simulate(plan, poisson_arrivals(plan, 5.0, 7), 5.0, seed=7).model_dump_json()
    b = simulate(plan, poisson_arrivals(plan, 5.0, 7), 5.0, seed=7).model_dump_json()
    c = simulate(plan, poisson_arrivals(plan, 5.0, 8), 5.0, seed=8).model_dump_json()
    assert a == b and a != c


def test_poisson_rate_and_routing_weights() -> None:
    plan = read_plan_doc(TINY)
    doc = simulate(plan, poisson_arrivals(plan, 20.0, 1, load=0.5), 20.0, seed=1, load=0.5)
    for w in doc.workloads:
        # below capacity every request completes and throughput follows the offered rate
        assert w.offered_requests_per_s == pytest.approx(0.5 * w.planned_requests_per_s, rel=0.05)
        assert w.completed == w.arrived
        assert w.throughput_requests_per_s == pytest.approx(w.offered_requests_per_s, rel=0.05)
        assert w.ttft_s.p50 is not None and w.ttft_s.p50 <= w.ttft_s.p99
    counts = [r.completed for r in doc.replicas]
    assert abs(counts[0] - counts[1]) <= 2  # weights 0.5 / 0.5, smooth WRR interleaves
    assert doc.unfinished == 0


def test_trace_arrivals_and_errors(tmp_path: Path) -> None:
    plan = read_plan_doc(TINY)
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"t": 0.5, "workload": "short"}\n\n{"t": 0.1, "workload": "long", "output_tokens": 3}\n')
    arr = trace_arrivals(plan, trace)
    assert [(a.workload, a.output_tokens) for a in arr] == [("long", 3), ("short", 16)]
    doc = simulate(plan, arr, 1.0, arrivals_name="t.jsonl", warmup=0.0)
    assert sum(w.completed for w in doc.workloads) == 2
    trace.write_text('{"t": 0.5, "workload": "shrot"}\n')
    with pytest.raises(SimulationError, match=r"t.jsonl:1: unknown workload 'shrot'; did you mean 'short'"):
        trace_arrivals(plan, trace)
    trace.write_text('{"t": 0.5}\n')
    with pytest.raises(SimulationError, match=r":1: each line needs 't'"):
        trace_arrivals(plan, trace)


def test_kv_full_preempts_and_everything_still_completes() -> None:
    rm = _rm(kv=600, max_num_seqs=32)
    sim = ReplicaSim("r", rm)
    driver = Driver([sim])
    done = []
    driver.on_done = done.append
    peak = {"running": 0, "kv": 0}
    orig = sim.form_batch

    def form(cutoff=float("inf")):
        b = orig(cutoff)
        peak["running"] = max(peak["running"], len(sim.running))
        peak["kv"] = max(peak["kv"], sim.kv_used)
        return b

    sim.form_batch = form
    for i in range(20):
        driver.loop.at(0.0, driver.submit, "r", Request(i, "w", 0.0, 50, 40))
    driver.loop.run(1e6)
    assert len(done) == 20 and sim.kv_used == 0 and not sim.running
    assert sim.preemptions > 0  # 20 x 90 tokens cannot all fit 600
    assert peak["kv"] <= 600 and peak["running"] <= 32
    assert all(r.generated == 40 for r in done)


def test_max_num_seqs_caps_concurrency() -> None:
    sim = ReplicaSim("r", _rm(max_num_seqs=4))
    driver = Driver([sim])
    seen = []
    orig = sim.form_batch
    sim.form_batch = lambda cutoff=float("inf"): (seen.append(len(sim.running)), orig(cutoff))[1]
    for i in range(10):
        driver.loop.at(0.0, driver.submit, "r", Request(i, "w", 0.0, 8, 8))
    driver.loop.run(1e6)
    assert max(seen) == 4 and sim.completed == 10


def test_request_larger_than_kv_is_an_error() -> None:
    sim = ReplicaSim("r", _rm(kv=10))
    driver = Driver([sim])
    with pytest.raises(ValueError, match="does not fit its KV cache of 10 tokens"):
        driver.submit("r", Request(0, "w", 0.0, 50, 4))


@pytest.mark.parametrize("hop", [0.0, 0.02])
def test_pipeline_matches_formula_decode_bound(hop: float) -> None:
    """Two stages, d micro-batches in flight: the slowest stage binds (hop 0) or the round trip
    does (20 ms hops, "depth"); with I = 1 the formula's steady state is exact; within 5%."""
    rm = _rm(depth=2, max_num_seqs=64, hop=hop)
    est = chain_capacity(rm, 1, 64)
    assert decode_rate(rm, est.concurrency, 1, 64)[1] == (hop == 0)  # which term of X binds
    sim = ReplicaSim("r", rm)
    driver = Driver([sim])
    peak = [0]
    orig = sim.launch
    sim.launch = lambda now, b: (peak.__setitem__(0, max(peak[0], sim.in_flight + 1)), orig(now, b))[1]
    done = []
    driver.on_done = lambda r: done.append(r.finish)
    for i in range(400):
        driver.loop.at(0.0, driver.submit, "r", Request(i, "w", 0.0, 1, 64))
    driver.loop.run(1e6)
    assert peak[0] == 2
    # completions per second while the replica is full (the middle of the run)
    done.sort()
    mid = done[100:300]
    rate = (len(mid) - 1) / (mid[-1] - mid[0])
    assert rate / est.requests_per_s == pytest.approx(1.0, abs=0.05)


def test_decode_bound_replica_matches_formula() -> None:
    """No prompts to speak of (I = 1): the formula's steady state is exact; within 5%."""
    rm = _rm(max_num_seqs=16)
    est = chain_capacity(rm, 1, 64)
    sim = saturation_throughput(rm, 1, 64, 1.3 * est.requests_per_s, 30.0)
    assert sim / est.requests_per_s == pytest.approx(1.0, abs=0.05)


@pytest.mark.parametrize("example", [
    "tiny-cpu", "cost-efficiency-appc", "quickstart",
    "three-regions",
    "llama70b-pp",
])
def test_simulated_capacity_within_10_percent(example: str) -> None:
    """As vLLM runs the replica (whole prompt chunks in one step, recompute preemption when the KV
    cache is full, PP micro-batches queueing behind a prefill): the formula's prefill lumps,
    preemption and overtake waits (perf/capacity.py) never promise more than the simulator serves
    (sim >= 0.9 x formula), and single-stage chains are within 10% both ways. PP chains may be
    conservative by up to 20%: the overtake wait W draws consecutive micro-batches independently and
    overstates a prompt lump's stall (llama70b-pp: the simulator serves 10-18% more in steady state,
    over 36 request lifetimes; a 12-lifetime window hid this in the warm-up transient). Four stages
    and more may be conservative by up to 30%: llama70b-pp's A10G chain r3 (tp2 x pp4, since issue
    18's tail sizing moved the plan) serves chat at 1.29x the formula in the simulator, long at 1.11x."""
    cases = capacity_cases(read_plan_doc(GOLDEN / example / "plan.json"))
    assert cases
    for c in cases:
        assert c.ratio >= KNOWN_OVERPROMISE.get((c.plan, c.replica, c.workload), 0.90), c
        assert c.ratio <= (1.10 if c.pp == 1 else 1.20 if c.pp <= 3 else 1.30), c


# A gap of the formula, written down rather than hidden: three-regions' r1 is Llama-2-13B on 2 x 2 T4
# (PP2), KV-bound at ~17 sequences, and rag's 1800-token prompts are 0.25 s prefill lumps per stage.
# The simulator serves 0.835-0.982 of the formula over seeds 0-5 (mean 0.89); the plan before the
# step-model change of issue 31 was no different (0.815-0.988, mean 0.91: seed 0 read 0.903). The
# plan routes 1e-5 of rag to r1 (compose weighs it, so the over-promise is real, but small there).
KNOWN_OVERPROMISE = {("three-regions", "r1", "rag"): 0.80}


@pytest.mark.parametrize("example", ["tiny-cpu", "cost-efficiency-appc", "quickstart", "three-regions", "llama70b-pp"])
def test_simulated_capacity_within_10_percent_under_the_formulas_assumptions(example: str) -> None:
    """Prefill spread evenly over the steps and no KV preemption (capacity_check.fluid_model): the
    simulator's batching, pipelining and hops must then reproduce h_{c,w} within 10% (15% from four
    stages: llama70b-pp's A10G tp2 x pp4 chain r3, in its plan since issue 18's tail sizing, serves
    long at 0.86x)."""
    cases = capacity_cases(read_plan_doc(GOLDEN / example / "plan.json"), fluid=True)
    assert cases
    for c in cases:
        assert c.ratio == pytest.approx(1.0, abs=0.10 if c.pp <= 3 else 0.15), c


def test_lumpy_prefill_is_slower_than_fluid() -> None:
    """A prompt in one step turns it compute-bound: the mean step is slower than the same prompt
    tokens spread evenly (the roofline is convex), and the KV-full replica pays for recompute."""
    rm = read_plan_doc(GOLDEN / "quickstart" / "plan.json").replicas[0].replica_model()
    assert rm is not None
    lumpy, fluid = chain_capacity(rm, 763, 232), chain_capacity(rm, 763, 232, fluid=True)
    assert lumpy.binding == "bottleneck-stage" and lumpy.concurrency < rm.max_num_seqs  # the KV binds
    assert lumpy.requests_per_s < 0.9 * fluid.requests_per_s and lumpy.tpot_s > fluid.tpot_s
    capped = chain_capacity(rm, 763, 232, max_concurrency=lumpy.concurrency * 0.999)  # KV not full: no preemption
    assert capped.requests_per_s > 1.05 * lumpy.requests_per_s


def test_cli_writes_schema_valid_simulation_and_explain_shows_it(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "plan.json").write_text(TINY.read_text())
    runner = CliRunner()
    res = runner.invoke(app, ["simulate", str(out), "--duration", "3s", "--seed", "2"])
    assert res.exit_code == 0, res.output
    assert "Simulation" in res.output and "short" in res.output
    data = json.loads((out / "simulation.json").read_text())
    schema = json.loads((ROOT / "schemas" / "simulation.schema.json").read_text())
    jsonschema.validate(data, schema)
    assert data["format"] == "hetcompile-simulation/1" and data["seed"] == 2
    first = (out / "simulation.json").read_bytes()
    assert runner.invoke(app, ["simulate", str(out), "--duration", "3s", "--seed", "2"]).exit_code == 0
    assert (out / "simulation.json").read_bytes() == first
    exp = runner.invoke(app, ["explain", str(out), "-f", "md"])
    assert exp.exit_code == 0, exp.output
    assert "## Simulation (simulation.json)" in exp.output and "| short |" in exp.output
    text = runner.invoke(app, ["explain", str(out)])
    assert text.exit_code == 0 and "Simulation (simulation.json)" in text.output
    assert "Simulation" not in runner.invoke(app, ["explain", str(GOLDEN / "tiny-cpu")]).output


def test_slo_attainment() -> None:
    from hetcompile.plan.doc import Slo

    plan = read_plan_doc(TINY)

    def with_slo(slo: Slo):
        wl = tuple(w.model_copy(update={"slo": slo}) for w in plan.workloads)
        p = plan.model_copy(update={"workloads": wl})
        return simulate(p, poisson_arrivals(p, 5.0, 0, load=0.5), 5.0, load=0.5)

    loose = with_slo(Slo(ttft_s=10.0, tpot_s=1.0))
    assert all(w.slo_attainment == 1.0 and w.slo_tpot_s == 1.0 for w in loose.workloads)
    tight = with_slo(Slo(tpot_s=1e-4))  # below one engine step
    assert all(w.slo_attainment == 0.0 for w in tight.workloads)
    tpots = {w.name: w.tpot_s.p50 for w in loose.workloads}
    mid = with_slo(Slo(tpot_s=tpots["short"]))  # the median: about half meet it
    att = next(w.slo_attainment for w in mid.workloads if w.name == "short")
    assert 0.3 <= att <= 0.8
    assert all(w.slo_attainment is None for w in simulate(plan, poisson_arrivals(plan, 2.0, 0), 2.0).workloads)


def test_cli_errors_are_clean(tmp_path: Path) -> None:
    runner = CliRunner()
    # every plan's replicas carry their step model now, mixed chains included: a Helix plan simulates
    helix = tmp_path / "helix"
    helix.mkdir()
    (helix / "plan.json").write_text((GOLDEN / "helix-geo24" / "plan.json").read_text())
    res = runner.invoke(app, ["simulate", str(helix), "--duration", "3s"])
    assert res.exit_code == 0, res.output
    # a plan.json written without one (hand-edited) is refused cleanly
    import json

    doc = json.loads((GOLDEN / "tiny-cpu" / "plan.json").read_text())
    for r in doc["replicas"]:
        r["step_model"] = None
    (tmp_path / "plan.json").write_text(json.dumps(doc))
    res = runner.invoke(app, ["simulate", str(tmp_path), "--duration", "3s"])
    assert res.exit_code == 1 and "has no step model" in res.output
    res = runner.invoke(app, ["simulate", str(GOLDEN / "tiny-cpu"), "--duration", "soon"])
    assert res.exit_code == 1 and "cannot read 'soon' as a duration" in res.output


def test_formula_ttft_tracks_the_simulator() -> None:
    """Under Poisson arrivals at 60% load, perf/capacity.py's TTFT (the wait for the step in
    progress, the prompt's chunks, the prompts that arrive beside it) is within 15% of the
    simulator's mean TTFT in median over the quickstart's shapes, and closer than without the wait
    (bench/simulate_ttft.py runs every example at three loads)."""
    import statistics

    from hetcompile.simulate.capacity_check import ttft_cases

    cases = ttft_cases(read_plan_doc(GOLDEN / "quickstart" / "plan.json"), loads=(0.6,))
    assert len(cases) >= 4
    err = statistics.median(abs(c.formula_s - c.simulated_s) / c.simulated_s for c in cases)
    base = statistics.median(abs(c.formula_no_wait_s - c.simulated_s) / c.simulated_s for c in cases)
    assert err <= 0.15 and err < base, (err, base)


def _l40s_70b(depth: int):
    from hetcompile.perf import analytic, catalog

    _, _, arch = catalog.lookup_model("llama-3-70b")
    gpu = catalog.lookup_gpu("L40S")
    entry = analytic.perf_entry("llama-3-70b", arch, 2, gpu, 2, 0.9, 4096)
    part = analytic.balanced_partition(entry, arch.layers, depth, 4096)
    stages = [(gpu, 2, k, analytic.stage_kv_tokens(entry, k, i == 0, i == depth - 1)) for i, k in enumerate(part)]
    return analytic.replica_model(arch, 2, stages, 1e-3, 1.25e9, 256)


def _saturation_ratio(rm, I: int, O: int) -> float:
    est = chain_capacity(rm, I, O)
    return saturation_throughput(rm, I, O, 1.3 * est.requests_per_s, 36 * (est.ttft_s + O * est.tpot_s)) / est.requests_per_s


@pytest.mark.parametrize("depth", [3, 4])
@pytest.mark.parametrize("shape", [(2400, 400), (128, 512)])
def test_deep_pipeline_is_not_over_promised(depth: int, shape: tuple[int, int]) -> None:
    """Llama-3-70B on 2x L40S nodes in PP3 / PP4 (the shapes llama70b-pp's compose weighs): the
    simulator serves at least 0.9x the formula at saturation. Before the lump fill/drain model
    (capacity.cluster_interval) the mean-round-trip formula promised 1.11-1.46x what the simulator
    served on three of these four."""
    assert _saturation_ratio(_l40s_70b(depth), *shape) >= 0.90


def test_deep_pipeline_cohorts() -> None:
    """PP3 chat (763 in / 232 out) at saturation with identical requests: 0.77x the formula while the
    simulator formed a micro-batch only when stage 0 was free (cohorts that completed behind a
    prompt step merged into one batch until fewer than d carried the decode); vLLM V1 forms one
    whenever fewer than d are in flight, and the d cohorts persist."""
    assert _saturation_ratio(_l40s_70b(3), 763, 232) >= 0.90


def test_pipeline_forms_the_next_batch_while_stage_0_is_busy() -> None:
    """vLLM V1's engine core schedules a micro-batch whenever its batch queue (pp_size deep) has
    room, and the batch waits for stage 0 in the pipeline: a batch completing while a prompt step
    holds stage 0 is re-formed at once (queued), never merged with the next one to complete, so d
    balanced cohorts of decode sequences stay in flight."""
    rm = _rm(depth=3, max_num_seqs=30)
    sim = ReplicaSim("r", rm)
    driver = Driver([sim], decode_runs=False)  # every launch through launch(): the runs give the same times
    queued, sizes = [0], []
    orig = sim.launch

    def launch(now, batch):
        queued[0] += sim.stage_free[0] > now
        if not batch.prefill:
            sizes.append(len(batch.decode))
        return orig(now, batch)

    sim.launch = launch
    for i in range(30):
        driver.loop.at(0.0, driver.submit, "r", Request(i, "w", 0.0, 8, 100))
    driver.loop.at(0.05, driver.submit, "r", Request(30, "w", 0.05, 400, 100))  # a prompt step, behind 30 decodes
    driver.loop.run(1e6)
    assert queued[0] > 0 and sim.completed == 31
    assert set(sizes[30:120]) == {10}  # three cohorts of ten, before the first finishes


def test_tail_rule_numbers() -> None:
    from hetcompile.simulate.tail import relaxation_s, requests_for_quantile

    assert requests_for_quantile(0.99) == 1000 and requests_for_quantile(0.9) == 100
    assert relaxation_s(0.9, 7.0) == pytest.approx(1 / (7.0 * (1 - 0.9**0.5) ** 2))  # ~55 s
    assert relaxation_s(1.0, 7.0) == float("inf")


def test_cli_warns_when_the_run_is_too_short_for_its_p99(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "plan.json").write_text(TINY.read_text())
    runner = CliRunner()
    # the plan runs its replicas at the default headroom, 85% of capacity: --load L offers 0.85 L of it
    half = f"{0.5 / 0.85:.6f}"
    # half the capacity: the queues settle in about a second, the p99 needs 1000 requests
    short = runner.invoke(app, ["simulate", str(out), "--duration", "3s", "--load", half])
    assert short.exit_code == 0, short.output
    assert "tail: a p99 needs >= 1000 completed requests per workload" in short.output
    assert "warning: p99 of workload 'long' comes from" in short.output  # 'short' arrives fast enough
    need = re.search(r"warning: run --duration (\d+)s or longer for a p99 to trust", short.output)
    assert need is not None and 3 < int(need.group(1)) < 60, short.output  # the rule's duration (plan-dependent)
    enough = f"{int(need.group(1)) + 5}s"
    long = runner.invoke(app, ["simulate", str(out), "--duration", enough, "--load", half])
    assert long.exit_code == 0 and f"--duration >= {need.group(1)}s" in long.output and "warning:" not in long.output
    # at the planned load (the 85% headroom) the queues settle: a 20 s run shows a steady p99
    planned = runner.invoke(app, ["simulate", str(out), "--duration", "20s"])
    assert "warning:" not in planned.output, planned.output
    # the busiest replica's utilization at the planned load (offered req/s x routing weight over its
    # capacity, summed over workloads), so the test sets the load it needs whatever the plan's sizing
    plan = json.loads(TINY.read_text())
    served = {w["name"]: w["served_requests_per_s"] for w in plan["workloads"]}
    rho = {r["id"]: sum(served[w] * plan["routing"][w].get(r["id"], 0.0) / c["capacity_requests_per_s"]
                        for w, c in r["workloads"].items()) for r in plan["replicas"]}
    busiest = max(rho, key=rho.get)
    # offered 5% past its capacity: the queue grows for the whole run, no duration shows a steady tail
    full = runner.invoke(app, ["simulate", str(out), "--duration", "20s", "--load", repr(1.05 / rho[busiest])])
    assert f"replica {busiest} is offered 105% of its capacity" in full.output, full.output
    assert "no duration shows a steady p99" in full.output
    # at 90% of it the queue settles over seconds (relaxation x 3): a 2 s warm-up understates the tail
    near = runner.invoke(app, ["simulate", str(out), "--duration", "20s", "--load", repr(0.9 / rho[busiest])])
    assert "runs at 90.0% of its capacity" in near.output and "understates the tail" in near.output, near.output


def test_stage_times_from_kept_terms_are_the_stage_models_own() -> None:
    """The simulator keeps ReplicaModel.stage_terms() and evaluates each kind of stage once per step;
    that must be step_seconds(StageModel.time, o + q m), bit for bit (one formula), with the host work
    overlapped (vLLM's async scheduling) or, for older engines, its share added."""
    from hetcompile.perf.stepmodel import step_seconds

    other = COST.model_copy(update={"flop_s_per_token": 3e-6, "serial_fraction": 0.2, "comm_s_per_token": 1e-7})
    rm = _rm(depth=3, layers=9).model_copy(update={"seq_overhead_s": 4e-5})
    rm = rm.model_copy(update={"stages": (rm.stages[0], rm.stages[1].model_copy(update={"cost": other, "head_s": 1e-3}),
                                          rm.stages[2].model_copy(update={"layers": 5}))})
    kinds, per_stage, index = rm.stage_terms()
    assert len(kinds) == 2 and [i for _, i, _ in per_stage] == [0, 1, 0] and index is None
    # stages alike (layers, kind, head) are evaluated once: a chain's first three of four share one
    alike = _rm(depth=4, layers=8).model_copy(update={"seq_overhead_s": 4e-5, "step_gpu_s": 1e-3})  # g: the last differs
    kinds, per_stage, index = alike.stage_terms()
    assert len(kinds) == 1 and len(per_stage) == 2 and index == (0, 0, 0, 1)
    for n in (64.0, 2048.0):  # the host's time, then the GPU's, binds
        host = alike.step_overhead_s + alike.seq_overhead_s * 64.0  # 64 sequences
        gpu = [st.time(n, 5e3, 5e3) + (alike.step_gpu_s if i == 3 else 0.0) for i, st in enumerate(alike.stages)]
        assert alike.stage_times(n, 5e3, 5e3, 64.0, alike.stage_terms()) == [max(g, host) for g in gpu]
    assert gpu[3] > gpu[0] > host
    for n, S, A, m in ((1.0, 900.0, 900.0, 1.0), (512.0, 3e4, 7e4, 40.0)):
        host = rm.step_overhead_s + rm.seq_overhead_s * m
        assert rm.stage_times(n, S, A, m, rm.stage_terms()) == [max(st.time(n, S, A), host) for st in rm.stages]
        old = rm.model_copy(update={"host_overlap": False})
        assert old.stage_times(n, S, A, m, old.stage_terms()) == [st.time(n, S, A) + host / 3 for st in rm.stages]
        assert [step_seconds(st.time(n, S, A), host) for st in rm.stages] == rm.stage_times(n, S, A, m)


def test_steady_arrivals_keep_the_load_on_until_the_window_has_finished() -> None:
    """steady_arrivals are poisson_arrivals that go on past the window (the same arrivals up to it);
    replay simulates the later ones only until every request of the window has finished, and the
    requests at the window's end then finish under load, not on an emptying replica: their TPOT is
    above what a drain gives them."""
    from hetcompile.simulate import steady_arrivals
    from hetcompile.simulate.run import replay, tpot_of

    plan = read_plan_doc(TINY)
    duration = 20.0
    plain, steady = poisson_arrivals(plan, duration, 3, load=0.9), steady_arrivals(plan, duration, 3, load=0.9)
    assert steady[:len(plain)] == plain and len(steady) > len(plain) and steady[-1].t > duration
    reqs, _ = replay(plan, steady, duration)
    window = [r for r in reqs if r.arrival <= duration]
    assert len(window) == len(plain) and all(r.finish is not None for r in window)
    later = [r for r in reqs if r.arrival > duration]
    assert later and any(r.finish is None for r in later)  # simulated while needed, then stopped
    drained, _ = replay(plan, plain, duration)
    last = [r.id for r in window if r.arrival > duration - 2.0 and tpot_of(r) is not None]
    assert last
    assert sum(tpot_of(reqs[i]) for i in last) > sum(tpot_of(drained[i]) for i in last)


def test_staged_arrivals_change_the_rate_per_stage() -> None:
    """--stages: each stage offers its own multiple of the plan's rates, one after the other, and the
    last stage keeps going past the end (steady_arrivals' rule)."""
    from hetcompile.simulate import staged_arrivals

    plan = read_plan_doc(TINY)
    total = sum(w.served_requests_per_s for w in plan.workloads)
    arr = staged_arrivals(plan, [(0.25, 200.0), (1.0, 200.0)], seed=3)
    first = sum(1 for a in arr if a.t < 200.0) / 200.0
    second = sum(1 for a in arr if 200.0 <= a.t < 400.0) / 200.0
    assert first == pytest.approx(0.25 * total, rel=0.15)
    assert second == pytest.approx(1.0 * total, rel=0.1)
    assert max(a.t for a in arr) > 400.0  # the last stage goes on, unmeasured
    assert arr == staged_arrivals(plan, [(0.25, 200.0), (1.0, 200.0)], seed=3)


def test_cli_stages(tmp_path: Path) -> None:
    out = tmp_path / "sim.json"
    res = CliRunner().invoke(app, ["simulate", str(TINY), "--stages", "0.5:20s,1.0:20s", "-o", str(out)])
    assert res.exit_code == 0, res.output
    doc = json.loads(out.read_text())
    assert doc["duration_s"] == 40.0 and doc["load"] == 1.0 and doc["arrivals"].startswith("poisson stages")
    assert "in stages" in res.output and "0.5:20s,1.0:20s" in res.output
    bad = CliRunner().invoke(app, ["simulate", str(TINY), "--stages", "fast:20s"])
    assert bad.exit_code != 0 and "--stages" in bad.output


def test_prefix_cache_hits_skip_their_prefill() -> None:
    """A request whose prompt prefix is cached prefills only the rest: a shorter TTFT, and a
    preempted one does not prefill the cached prefix again."""
    from hetcompile.simulate import loadgen

    rm = _rm(kv=1e6)
    pairs = [(2000, 20)] * 20
    cold = loadgen.open_loop(rm, 2.0, pairs, seed=1)
    warm = loadgen.open_loop(rm, 2.0, pairs, seed=1, cached=1500)
    assert warm.ttft_s < 0.5 * cold.ttft_s
    assert warm.itl_mean_s > 0 and warm.e2e_mean_s > warm.ttft_mean_s


# -- decode runs and the pipeline's ready heap are exact (simulate/engine.py's module docstring) ----

def _trace(seed: int, n: int, rate: float) -> list[tuple[float, int, int, int]]:
    import random

    rng = random.Random(seed)
    t, out = 0.0, []
    for _ in range(n):
        t += rng.expovariate(rate)
        out.append((t, rng.choice([8, 60, 300, 900]), rng.choice([1, 2, 5, 40, 120]), rng.choice([0, 0, 50])))
    return out


def _replay_exactly(rms: list[ReplicaModel], trace, fast: bool, until: float, stop_after: int | None,
                    prefill_first: bool = False, then: float | None = None):
    """Every request's times and every replica's counters, with decode runs and ready heaps on
    (`fast`) or with every step its own event and every pick a scan (the reference); `then`: the
    loop stops at `until` (runs in flight cut back there) and goes on to `then`."""
    sims = [ReplicaSim(f"r{i}", rm, prefill_first=prefill_first) for i, rm in enumerate(rms)]
    for s in sims:
        s.measure_until = until * 0.6
        if not fast:
            s.ready = None
    done = [0]

    def on_done(_r) -> None:
        done[0] += 1

    drv = Driver(sims, on_done=on_done, decode_runs=fast)
    reqs = []
    for i, (t, inp, out, cached) in enumerate(trace):
        r = Request(i, "w", t, inp, out, cached=min(cached, inp - 1))
        reqs.append(r)
        drv.loop.at(t, drv.arrive, f"r{i % len(sims)}", r)
    drv.loop.run(until, stop=None if stop_after is None else (lambda: done[0] >= stop_after))
    if then is not None:
        drv.loop.run(then)
    return ([(r.id, r.first_token, r.finish, r.generated, r.kv, r.preemptions, r.prefilled) for r in reqs],
            [(s.steps, s.step_tokens, s.busy_s, s.completed, s.preemptions, s.kv_used, s.in_flight) for s in sims],
            drv.loop.now)


@pytest.mark.parametrize("seed", range(6))
def test_decode_runs_and_ready_heaps_give_the_step_by_step_results_bit_for_bit(seed: int) -> None:
    # one-stage replicas (decode runs), pipelines (ready heaps), a KV cache small enough to preempt,
    # prefix-cache hits, and runs cut by `until` and by `stop` in the middle
    rms = [_rm(kv=[1e6, 3000, 1200][seed % 3], max_num_seqs=[8, 32][seed % 2]),
           _rm(kv=[1e6, 2500][seed % 2], depth=2, hop=1e-4), _rm(depth=4, max_num_seqs=16),
           _rm(kv=1100, depth=4, max_num_seqs=24)]  # a pipeline that preempts: stale heap entries
    trace = _trace(seed, 400, rate=[20.0, 60.0, 150.0][seed % 3])
    for until, stop_after in ((1e9, None), (trace[-1][0] * 0.5, None), (1e9, 250)):
        fast = _replay_exactly(rms, trace, True, until, stop_after)
        slow = _replay_exactly(rms, trace, False, until, stop_after)
        assert fast == slow
    v0 = [_rm(kv=4000)]
    assert _replay_exactly(v0, trace[:150], True, 1e9, None, True) == _replay_exactly(v0, trace[:150], False, 1e9, None, True)


def test_decode_runs_do_run() -> None:
    """The fast path is taken (else the test above compares the reference with itself)."""
    runs = []
    real = ReplicaSim.decode_run

    def spy(self, *a):
        run = real(self, *a)
        runs.append(run)
        return run

    ReplicaSim.decode_run = spy
    try:
        _replay_exactly([_rm()], _trace(0, 100, 20.0), True, 1e9, None)
    finally:
        ReplicaSim.decode_run = real
    assert sum(1 for r in runs if r is not None) > 10


def test_pipeline_decode_runs_do_run_and_are_cut_back() -> None:
    """The pipelines' fast path is taken, also with a prompt's chunk in flight, and `until` cuts a
    run in flight back mid-way (else the bit-for-bit test compares the reference with itself there)."""
    runs, cuts, around_prompts = [], [], []
    real_start, real_apply = ReplicaSim.start_pipeline_run, ReplicaSim.apply_pipeline_run

    def start(self, *a):
        run = real_start(self, *a)
        runs.append(run)
        if run is not None and self.prefilling:
            around_prompts.append(run)
        return run

    def apply(self, run, completed):
        if 0 < completed < len(run.steps):
            cuts.append(completed)
        return real_apply(self, run, completed)

    ReplicaSim.start_pipeline_run, ReplicaSim.apply_pipeline_run = start, apply
    try:
        rms = [_rm(depth=2, hop=1e-4), _rm(depth=4, max_num_seqs=16)]
        trace = _trace(1, 200, 20.0)
        for until in (3.0, 4.5, 6.0):  # cut back, then on from there
            assert _replay_exactly(rms, trace, True, until, None, then=1e9) == _replay_exactly(rms, trace, False, until, None, then=1e9)
    finally:
        ReplicaSim.start_pipeline_run, ReplicaSim.apply_pipeline_run = real_start, real_apply
    assert sum(1 for r in runs if r is not None) > 10 and cuts and len(around_prompts) > 10


def test_a_rebuild_removes_the_simulation_and_charts_of_another_plan(tmp_path: Path) -> None:
    """explain shows OUT/simulation.json under the plan: a build into a folder that holds one of
    another spec (or a chart this plan does not draw) removes it; one of this spec stays."""
    from conftest import build
    from hetcompile.backends.emit import write

    ir = build(ROOT / "examples/tiny-cpu/spec.yaml").ir
    out = tmp_path / "out"
    (out / "charts").mkdir(parents=True)
    (out / "simulation.json").write_text(json.dumps({"plan": "old", "spec_hash": "sha256:other"}))
    (out / "charts" / "frontier.svg").write_text("<svg/>")
    write(ir, out)
    assert not (out / "simulation.json").exists() and not (out / "charts" / "frontier.svg").exists()
    (out / "simulation.json").write_text(json.dumps({"plan": ir.name, "spec_hash": ir.spec_hash}))
    write(ir, out)
    assert (out / "simulation.json").exists()


def test_simulated_load_is_plan_mds_busy_not_the_stepping_share() -> None:
    """simulation.json's replica utilization is what plan.md and explain call busy (served over
    full-load capacity), measured; the share of time with a step in flight is near 1 at any real load
    and is reported apart (`stepping`), never as the replica's load."""
    from hetcompile.explain.rates import utilisation

    plan = read_plan_doc(GOLDEN / "quickstart" / "plan.json")
    doc = simulate(plan, poisson_arrivals(plan, 300.0, 3), 300.0, seed=3)
    planned = {r.id: utilisation(plan, r) for r in plan.replicas}
    for r in doc.replicas:
        assert 0.75 * planned[r.id] <= r.utilization <= 1.25 * planned[r.id], (r.id, r.utilization, planned[r.id])
        assert r.stepping > r.utilization
    assert max(planned.values()) < 0.9


@pytest.mark.parametrize("overlap", [True, False])
def test_async_scheduling_admits_a_request_into_the_batch_after_next(overlap: bool) -> None:
    """vLLM V1's async scheduling forms batch N+1 when batch N launches, so a request the scheduler
    sees while step N runs joins batch N+2; without it (V0), batch N+1. An idle replica takes it at once."""
    rm = _rm().model_copy(update={"host_overlap": overlap})

    def run(submit_at: float, busy: bool) -> tuple[Request, list[float]]:
        sim = ReplicaSim("r", rm)
        driver = Driver([sim], decode_runs=False)
        ends: list[float] = []
        orig = sim.complete
        sim.complete = lambda now, batch: (ends.append(now), orig(now, batch))[1]
        if busy:
            driver.loop.at(0.0, driver.submit, "r", Request(0, "w", 0.0, 8, 50))
        late = Request(1, "w", 0.0, 8, 2)
        driver.loop.at(submit_at, driver.submit, "r", late)
        driver.loop.run(1e6)
        return late, ends

    late, ends = run(0.020, busy=True)  # steps of ~8 ms: submitted while step N (16-24 ms) runs
    after = [e for e in ends if e > 0.020]  # ends of N, N+1, N+2, ...
    assert late.first_token == pytest.approx(after[2] if overlap else after[1])
    alone, ends = run(0.020, busy=False)
    assert alone.first_token == pytest.approx(ends[0])  # idle: its own step starts at once


def test_step_gpu_time_is_on_the_last_stage_and_not_overlapped() -> None:
    """g (step_gpu_s): GPU work of a step outside the per-layer kernels (the sampler, input copies):
    on the last stage's GPU time, so it adds to a GPU-bound step and every consumer sees it through
    stage_times (the simulator reads stage_terms)."""
    rm = _rm(depth=2)
    g = rm.model_copy(update={"step_gpu_s": 1e-3})
    base, more = rm.stage_times(64.0, 64_000.0, 64_000.0, 64.0), g.stage_times(64.0, 64_000.0, 64_000.0, 64.0)
    assert more[0] == base[0] and more[1] == pytest.approx(base[1] + 1e-3)
    assert g.stage_terms()[1][-1][2] == pytest.approx(rm.stage_terms()[1][-1][2] + 1e-3)
    assert decode_rate(g, 8.0, 256, 128)[0] < decode_rate(rm, 8.0, 256, 128)[0]
