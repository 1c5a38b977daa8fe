"""Each pass alone, on an IR built by hand: what it reads, what it writes, what it refuses.

The spec is only lowered (ir/lower.py, no pass runs); the pass products a pass reads (a
composition, replicas) are written here, small enough to check the pass's output by hand. The
end-to-end builds (test_examples.py) check the passes together.
"""

from __future__ import annotations

import math

import pytest

from conftest import ROOT
from hetcompile.errors import PassError
from hetcompile.ir.lower import load_problem
from hetcompile.ir.problem import Composition, Problem, Replica, ShapeEstimate, Stage
from hetcompile.opt.solve import SolverOptions
from hetcompile.passes.base import PassContext, run_pipeline
from hetcompile.passes.parallelize import Parallelize
from hetcompile.passes.prune import Prune
from hetcompile.passes.route import DEFAULT_TTFT_FACTOR, FIRST_BYTE_MAX_S, FIRST_BYTE_MIN_S, Route

CTX = PassContext(solver=SolverOptions())


def _ir() -> Problem:
    """The quickstart, lowered: chat (763 -> 232 tokens, 6/s) and summarize (3000 -> 200, 1/s) on
    llama-3.1-8b; L4 and A100 in us-central1, A10G in us-east-1."""
    return load_problem(ROOT / "examples/quickstart/spec.yaml")[0]


def _estimate(rps: dict[str, float], conc: dict[str, float], ttft: dict[str, float]) -> ShapeEstimate:
    return ShapeEstimate(kv_capacity_tokens=50_000, prefill_tokens_per_s=9000.0, decode_tokens_per_s=1500.0,
                         throughput_rps=tuple(rps.items()), concurrency=tuple(conc.items()),
                         binding=tuple((w, "kv") for w in rps), ttft_s=tuple(ttft.items()))


def _replica(rid: str, shape: str, stages: list[tuple[str, str, int, int, int]], est: ShapeEstimate,
             dtype: str = "bfloat16") -> Replica:
    """stages: (node, gpu, tp, layer_start, layer_end), all in us-central1."""
    return Replica(id=rid, model="llama-3.1-8b", shape=shape, dtype=dtype, estimate=est,
                   stages=tuple(Stage(node=n, gpu=g, region="us-central1", tp=t, layer_start=a, layer_end=b)
                                for n, g, t, a, b in stages))


EST = _estimate({"chat": 4.0, "summarize": 0.5}, {"chat": 40.0, "summarize": 8.0}, {"chat": 0.2, "summarize": 0.9})


# -- prune -----------------------------------------------------------------------------------------

def test_prune_changes_nothing_but_says_why() -> None:
    ir = _ir().model_copy(update={"composition": Composition(counts=(), rates=(), scale=1.0, objective="max-throughput",
                                                             binding=())})
    out = Prune().run(ir, CTX)
    assert out.model_copy(update={"reports": ()}) == ir
    assert out.reports[-1].name == "prune" and "no links to prune" in out.reports[-1].notes[0]


# -- parallelize -----------------------------------------------------------------------------------

def test_parallelize_sets_dtype_and_marks_mixed_chains() -> None:
    ir = _ir()
    ir = ir.model_copy(update={
        "models": tuple(m.model_copy(update={"dtype": "bfloat16"}) for m in ir.models),
        "gpus": tuple(g.model_copy(update={"bf16": g.name != "L4"}) for g in ir.gpus),  # pretend L4 lacks bf16
        "replicas": (_replica("r0", "a", [("n0", "A100", 1, 0, 32)], EST),
                     _replica("r1", "b", [("n1", "A100", 1, 0, 16), ("n2", "L4", 1, 16, 32)], EST)),
    })
    out = Parallelize().run(ir, CTX)
    r0, r1 = out.replicas
    assert (r0.dtype, r0.mixed) == ("bfloat16", False)
    assert (r1.dtype, r1.mixed) == ("float16", True)  # one stage lacks bf16: every node must agree on fp16
    assert out.reports[-1].notes == ("r1: bf16 was asked for but a stage's GPU lacks bf16: using float16",)


def test_parallelize_refuses_a_chain_with_two_tp_sizes() -> None:
    ir = _ir().model_copy(update={"replicas": (_replica("r0", "a", [("n0", "A100", 1, 0, 16), ("n1", "A100", 2, 16, 32)], EST),)})
    with pytest.raises(PassError, match="TP sizes"):
        Parallelize().run(ir, CTX)


# -- route -----------------------------------------------------------------------------------------

def _routed(rates: tuple[tuple[str, str, float], ...], counts: tuple[tuple[str, int], ...]) -> Problem:
    return _ir().model_copy(update={
        "composition": Composition(counts=counts, rates=rates, scale=1.0, objective="max-throughput", binding=()),
        "replicas": (_replica("r0", "big", [("n0", "A100", 1, 0, 32)], EST),
                     _replica("r1", "small", [("n1", "L4", 1, 0, 32)], EST),
                     _replica("r2", "small", [("n2", "L4", 1, 0, 32)], EST)),
    })


def test_route_weights_are_composes_rates_split_over_copies() -> None:
    # big: chat 3/s; small (2 copies): chat 3/s and summarize 1/s in all
    ir = _routed((("big", "chat", 3.0), ("small", "chat", 3.0), ("small", "summarize", 1.0)), (("big", 1), ("small", 2)))
    table = Route().run(ir, CTX).routing
    (model,) = table.models
    classes = {c.name: c for c in model.classes}
    assert {w.replica: w.weight for w in classes["chat"].weights} == {"r0": 0.5, "r1": 0.25, "r2": 0.25}
    assert {w.replica: w.weight for w in classes["summarize"].weights} == {"r1": 0.5, "r2": 0.5}
    # the shorter prompts' class matches below the geometric mean of the two inputs; the last takes the rest
    assert classes["chat"].match.prompt_tokens_max == round(math.sqrt(763 * 3000))
    assert classes["summarize"].match.prompt_tokens_max is None


def test_route_admission_limits_follow_the_planned_mix() -> None:
    ir = _routed((("big", "chat", 3.0), ("small", "chat", 3.0), ("small", "summarize", 1.0)), (("big", 1), ("small", 2)))
    reps = {r.id: r for r in Route().run(ir, CTX).routing.replicas}
    # r0 serves chat only: C = chat's 40, h = 4/s, budget = max(1 s, 4 x 0.2 s) -> Q = floor(4 x 1) = 4
    assert (reps["r0"].planned_concurrency, reps["r0"].capacity_requests_per_s, reps["r0"].max_queue) == (40, 4.0, 4)
    assert reps["r0"].first_byte_timeout_s == max(FIRST_BYTE_MIN_S, 4 * (1.0 + 0.2))
    # r1: chat 1.5/s and summarize 0.5/s -> weights 3/4, 1/4
    budget_s = max(1.0, DEFAULT_TTFT_FACTOR * 0.9)
    assert reps["r1"].planned_concurrency == math.floor(0.75 * 40 + 0.25 * 8)
    assert reps["r1"].max_queue == math.floor(0.75 * math.floor(4.0 * 1.0) + 0.25 * math.floor(0.5 * budget_s))
    assert reps["r1"].first_byte_timeout_s == min(FIRST_BYTE_MAX_S, 4 * (budget_s + 0.9))


def test_route_needs_replicas_and_a_composition() -> None:
    with pytest.raises(PassError, match="needs `replicas`"):
        run_pipeline(_ir(), (Route(),), CTX)


# -- compose ---------------------------------------------------------------------------------------

def _shapes_only(ir: Problem, keep: set[str]) -> Problem:
    """The profile pass on the lowered spec, with its shapes cut to the single-GPU ones of `keep`."""
    from hetcompile.passes.profile import Profile

    out = Profile().run(ir, CTX)
    return out.model_copy(update={"shapes": tuple(s for s in out.shapes if s.gpu in keep and s.tp * s.pp == 1)})


def test_compose_buys_within_budget_and_availability_and_routes_every_served_rate() -> None:
    ir = _shapes_only(_ir(), {"L4", "A100"})
    from hetcompile.passes.compose import Compose

    out = Compose().run(ir, CTX)
    comp = out.composition
    shapes = {s.id: s for s in ir.shapes}
    price = sum(shapes[c].price_per_s * y for c, y in comp.counts)
    assert 0 < price <= ir.budget_per_s * (1 + 1e-9)
    offers = {o.id: o for o in ir.offers}
    for c, y in comp.counts:
        assert y <= offers[shapes[c].offer].max_nodes  # single-GPU nodes: one replica per node
    # theta x demand is served, within each shape's planned capacity per copy
    served = {w.name: 0.0 for w in ir.workloads}
    for c, w, rate in comp.rates:
        served[w] += rate
        assert rate <= dict(comp.counts)[c] * dict(shapes[c].estimate.throughput_rps)[w] * (1 + 1e-6)
    for w in ir.workloads:
        assert served[w.name] == pytest.approx(comp.scale * w.demand, rel=1e-6)
    assert comp.objective == "max-throughput" and out.reports[-1].status == "optimal"


def test_compose_with_no_shape_that_fits_says_what_binds() -> None:
    from hetcompile.errors import InfeasibleError
    from hetcompile.passes.compose import Compose

    ir = _shapes_only(_ir(), {"A100"}).model_copy(update={"budget_per_s": 0.5 / 3600})
    with pytest.raises(InfeasibleError, match="budget"):
        Compose().run(ir, CTX)


# -- what-if --------------------------------------------------------------------------------------

def test_what_if_re_solves_around_compose_s_plan_and_never_reports_less_than_it() -> None:
    """compose writes no what-if (it ran per verification round before); the what-if pass, on the
    composed IR alone, prices all demand, states the budget step's marginal, and the frontier
    holds this plan. A re-solve stopped at one branch-and-bound node still starts from the plan:
    no marginal is negative."""
    from hetcompile.passes.compose import Compose
    from hetcompile.passes.what_if import WhatIf

    composed = Compose().run(_shapes_only(_ir(), {"L4", "A100"}), CTX)
    assert composed.composition.what_if is None and composed.composition.alternatives is None
    assert dict(composed.composition.composed.counts) == dict(composed.composition.counts)
    out = WhatIf().run(composed, CTX)
    w, alts = out.composition.what_if, out.composition.alternatives
    assert w.full_demand_price_per_hour > 0 and w.text
    assert [m.kind for m in w.marginals][:1] == ["budget"] and all(m.scale_delta >= 0 for m in w.marginals)
    assert any(p.this_plan for p in alts.frontier) and alts.runners_up
    assert out.reports[-1].name == "what-if" and "re-solves" in out.reports[-1].notes[0]
    tiny = WhatIf().run(composed, PassContext(solver=SolverOptions(node_limit=1)))
    assert all(m.scale_delta >= 0 for m in tiny.composition.what_if.marginals)


def test_what_if_skips_a_min_cost_plan_and_says_why() -> None:
    from hetcompile.passes.what_if import WhatIf

    ir = _ir().model_copy(update={"objective": "min-cost", "composition": Composition(
        counts=(), rates=(), scale=1.0, objective="min-cost", binding=())})
    out = WhatIf().run(ir, CTX)
    assert out.composition.what_if is None and out.reports[-1].status == "skipped"


# -- verify ----------------------------------------------------------------------------------------

def _stand_in_simulation(monkeypatch, long_misses: bool = False, ratios: bool = False):
    """The verify pass with its simulation replaced: chat's SLO (p99 TPOT 0.1 s) holds at shares
    <= 0.8 of the tail model's load and misses above; with `long_misses`, long's queueing bound
    misses at every share; with `ratios`, the records carry chat's TPOT bound ratio (f / 0.8).
    Returns the pass module."""
    from hetcompile.passes import verify as vp
    from hetcompile.plan.doc import VerifiedWorkload
    from hetcompile.simulate.doc import SimulationDoc
    from hetcompile.simulate.verify import Miss

    def replay_at(factors: tuple, workers: int = 1) -> tuple:
        f = dict(factors).get("chat", 1.0)
        ws = [VerifiedWorkload(name="chat", target="slo", percentile="p99", ttft_target_s=2.0, tpot_target_s=0.1,
                               ttft_s=1.0, tpot_s=0.1 * f / 0.8, p99_ttft_s=1.0, p99_tpot_s=0.1 * f / 0.8,
                               attainment=0.995 if f <= 0.8 else 0.9, met=f <= 0.8, factor=1.0,
                               tpot_ratio=f / 0.8 if ratios else None)]
        misses = [] if f <= 0.8 else [Miss("chat", "TPOT", "p99", 0.1 * f / 0.8, 0.1)]
        if long_misses:
            ws.append(VerifiedWorkload(name="long", target="queueing", percentile="p99", ttft_target_s=5.0,
                                       tpot_target_s=None, ttft_s=9.0, tpot_s=None, p99_ttft_s=9.0, p99_tpot_s=None,
                                       attainment=0.9, met=False, factor=1.0))
            misses.insert(0, Miss("long", "TTFT", "p99", 9.0, 5.0, kind="queueing"))
        doc = SimulationDoc(plan="q", spec_hash="h", arrivals="poisson", load=1.0, seed=0, policy="weighted",
                            duration_s=100.0, warmup_s=10.0, workloads=(), replicas=(), unfinished=0)
        return [doc], ws, misses

    monkeypatch.setattr(vp, "plan_doc", lambda ir: ir.tail_factors)
    monkeypatch.setattr(vp.replay, "verify", replay_at)
    monkeypatch.setattr(vp.replay, "beyond_budget", lambda plan: None)
    return vp


def _run_recording_replans(vp) -> tuple[Problem, list[tuple]]:
    """The verify pass run on a small IR with a stand-in replan that records the factors asked for:
    (its result, the factors of each replan)."""
    asked: list[tuple] = []
    base = _ir()

    def replan(update: dict) -> Problem:
        asked.append(update["tail_factors"])
        return base.model_copy(update=update)

    return vp.Verify().run(base, PassContext(solver=SolverOptions(), replan=replan)), asked


def test_verify_tightens_the_missed_workload_then_bisects_and_keeps_the_last_plan_that_held(monkeypatch) -> None:
    """The verify pass's loop on its own: a stand-in simulation that misses chat's TPOT above a
    share of 0.8 of the tail model's load, and a stand-in replan that records the factors asked for."""
    vp = _stand_in_simulation(monkeypatch)
    out, asked = _run_recording_replans(vp)
    # 1.0 missed (0.125 s > 0.1 s): x 0.8; 0.8 held; then bisect between 0.8 and the lowest miss, 5 plans in all
    assert [dict(t)["chat"] for t in asked] == pytest.approx([0.8, 0.9, 0.85, 0.825])
    # the result is the plan that held (round 2), with its round's verification and the pass's
    # report, which count the 5 plans simulated in all
    assert out.tail_factors == (("chat", 0.8),) and out.verification.rounds == 5
    assert out.verification.workloads[0].factor == pytest.approx(0.8) and "5 plans simulated" in out.reports[-1].notes[0]
    assert out.reports[-1].name == "verify" and out.reports[-1].status == "met"
    assert "chat planned at 80% of the tail model's load" in out.reports[-1].notes


def test_verify_steps_along_the_measured_ratio_and_stops_where_it_promises_no_more(monkeypatch) -> None:
    """The same stand-in, with chat's TPOT bound ratio in its records: 1.0 missed (x 0.8), 0.8 held
    with the ratio at 1, so the line through both rounds promises nothing above 0.8: two plans, not
    five."""
    vp = _stand_in_simulation(monkeypatch, ratios=True)
    out, asked = _run_recording_replans(vp)
    assert [dict(t)["chat"] for t in asked] == pytest.approx([0.8])
    assert out.tail_factors == (("chat", 0.8),) and out.verification.rounds == 2


def test_verify_keeps_the_last_plan_whose_slos_held_when_a_queueing_bound_never_does(monkeypatch) -> None:
    """chat's SLO holds at shares <= 0.8 of the tail model's load; long's queueing bound misses at
    every share (it shares chat's replicas). No plan meets every target, and the last round misses
    chat: the result is the round-2 plan, where chat held, with long's bound unmet, not an error (and
    the 5 plans simulated in all)."""
    vp = _stand_in_simulation(monkeypatch, long_misses=True)
    base = _ir()
    out = vp.Verify().run(base, PassContext(solver=SolverOptions(),
                                            replan=lambda update: base.model_copy(update=update)))
    assert dict(out.tail_factors)["chat"] == pytest.approx(0.8) and out.verification.rounds == 5
    assert out.reports[-1].status == "unmet" and any(u.startswith("long:") for u in out.verification.unmet)


def test_verify_does_not_replay_a_plan_beyond_its_work_budget_and_says_what_it_would_take(monkeypatch) -> None:
    """A plan whose settling warm-up alone exceeds half the work budget (scale1072: 4,925 req/s) is
    not replayed: every request of a window that starts before the fleet settles would miss, and
    each round would replan for nothing. The quickstart's plan with the budget cut to 100 requests."""
    from hetcompile.passes import verify as vp
    from hetcompile.plan.io import read_plan_doc
    from hetcompile.simulate import verify as sv

    plan = read_plan_doc(ROOT / "tests/golden/quickstart/plan.json", "plan")
    assert sv.beyond_budget(plan) is None
    monkeypatch.setattr(sv, "VERIFY_MAX_REQUESTS", 100)
    needed, settle = sv.beyond_budget(plan)
    assert needed > 100 * 10 and settle > 0
    monkeypatch.setattr(vp, "plan_doc", lambda ir: plan)
    monkeypatch.setattr(vp.replay, "verify", lambda *a, **k: pytest.fail("replayed a plan beyond the work budget"))
    out = vp.Verify().run(_ir(), CTX)
    assert out.reports[-1].status == "skipped" and out.verification is None
    assert out.reports[-1].notes[0].startswith("not simulated") and f"{needed:,} requests" in out.reports[-1].notes[0]


# -- place -----------------------------------------------------------------------------------------

def test_place_lowers_each_composed_copy_to_a_chain_covering_the_model() -> None:
    from hetcompile.passes.compose import Compose
    from hetcompile.passes.place import Place

    composed = Compose().run(_shapes_only(_ir(), {"L4", "A100"}), CTX)
    out = Place().run(composed, CTX)
    counts = dict(composed.composition.counts)
    assert len(out.replicas) == sum(counts.values())
    assert sorted({r.id for r in out.replicas}) == sorted(r.id for r in out.replicas)  # ids unique
    layers = composed.models[0].arch.layers
    for r in out.replicas:
        assert r.shape in counts
        assert [(s.layer_start, s.layer_end) for s in r.stages] == [(0, layers)]  # single-GPU shapes: one stage
        assert {s.node for s in r.stages} <= {n.id for n in out.nodes}
    assert sum(n.price_per_s for n in out.nodes) == pytest.approx(
        sum(s.price_per_s * counts[s.id] for s in composed.shapes if s.id in counts))


# -- profile: shapes the spec pins (models[].tp / pp) ------------------------------------------------

def _pinned(tmp_path, extra: str) -> Problem:
    spec = (ROOT / "examples/quickstart/spec.yaml").read_text().replace("    dtype: auto\n", f"    dtype: auto\n{extra}")
    path = tmp_path / "spec.yaml"
    path.write_text(spec.replace("gpus_per_node: 1, max_nodes: 4", "gpus_per_node: 4, max_nodes: 4"))
    return load_problem(path)[0]


def test_profile_enumerates_only_the_pinned_tp_and_pp(tmp_path) -> None:
    from hetcompile.passes.profile import Profile

    free = Profile().run(_pinned(tmp_path, ""), CTX).shapes
    assert {(s.tp, s.pp) for s in free} > {(2, 1)}  # unpinned: several TP degrees
    got = Profile().run(_pinned(tmp_path, "    tp: 2\n"), CTX).shapes
    assert got and {s.tp for s in got} == {2} and {s.offer for s in got} == {"us-central1/A100x4"}  # only 4-GPU nodes
    deep = Profile().run(_pinned(tmp_path, "    tp: [1, 2]\n    pp: 2\n"), CTX).shapes
    assert deep and {s.pp for s in deep} == {2} and {s.tp for s in deep} == {1, 2}


def test_pinned_shapes_that_nothing_can_run_say_why(tmp_path) -> None:
    from hetcompile.errors import InfeasibleError, SpecError
    from hetcompile.passes.compose import Compose
    from hetcompile.passes.profile import Profile

    ir = Profile().run(_pinned(tmp_path, "    tp: 8\n"), CTX)
    with pytest.raises(InfeasibleError) as e:
        Compose().run(ir, CTX)
    assert "pinned to tp 8" in str(e.value) and "us-east-1/A10Gx1: tp 8 (the least allowed) needs 8 GPUs" in str(e.value)
    with pytest.raises(SpecError, match="tp 3 is not a power of two"):
        _pinned(tmp_path, "    tp: 3\n")
    with pytest.raises(SpecError, match="pp 64 is more stages than its 32 layers"):
        _pinned(tmp_path, "    pp: 64\n")


# -- compose: copies of one kind of workload are one row of the MILP --------------------------------

def test_merge_alike_is_exact_and_splits_by_demand() -> None:
    """Two workloads with identical columns h_{., w} merge into one of the summed demand; the split
    solution gives each its share of every shape's rate, and the same y, theta and cost."""
    from hetcompile.passes.compose_model import ComposeSolution, ComposeTables, merge_alike, split_alike

    t = ComposeTables(shapes=("a", "b"), workloads=("w1", "w2", "w3"), offers=("o",), shape_offer={"a": "o", "b": "o"},
                      shape_gpus={"a": 1, "b": 2}, demand={"w1": 1.0, "w2": 3.0, "w3": 5.0}, avail={"o": 8}, owned={"o": 0},
                      price={"o": 1e-3}, budget=None,
                      h={("a", "w1"): 2.0, ("b", "w1"): 5.0, ("a", "w2"): 2.0, ("b", "w2"): 5.0, ("a", "w3"): 1.0})
    merged, groups = merge_alike(t)
    assert merged.workloads == ("w1", "w3") and merged.demand == {"w1": 4.0, "w3": 5.0} and groups == {"w1": ("w1", "w2")}
    sol = ComposeSolution(y={"a": 1, "b": 1}, r={("a", "w1"): 2.0, ("b", "w1"): 2.0, ("a", "w3"): 5.0}, theta=1.0, cost=0.0)
    got = split_alike(sol, t, groups)
    assert got.r == {("a", "w1"): 0.5, ("a", "w2"): 1.5, ("a", "w3"): 5.0, ("b", "w1"): 0.5, ("b", "w2"): 1.5}
    assert (got.y, got.theta, got.cost) == (sol.y, sol.theta, sol.cost)
    assert merge_alike(merged)[1] == {}  # all different: the tables as they are


def test_compose_of_copied_workloads_equals_compose_of_their_sum(tmp_path) -> None:
    """The quickstart with chat split into two identical workloads (4/s and 2/s) composes the same
    replicas and scale as the quickstart itself (chat 6/s), each copy served in proportion."""
    from hetcompile.passes.compose import Compose
    from hetcompile.passes.profile import Profile

    text = (ROOT / "examples/quickstart/spec.yaml").read_text()
    chat = "  - name: chat\n    model: llama-3.1-8b\n    input_tokens: 763\n    output_tokens: 232\n    rate: 6/s\n"
    assert chat in text
    split = text.replace(chat, chat.replace("6/s", "4/s") + chat.replace("name: chat", "name: chat2").replace("6/s", "2/s"))
    path = tmp_path / "spec.yaml"
    path.write_text(split)
    one = Compose().run(Profile().run(_ir(), CTX), CTX).composition
    two = Compose().run(Profile().run(load_problem(path)[0], CTX), CTX).composition
    assert two.counts == one.counts and two.scale == pytest.approx(one.scale, rel=1e-6)
    served = {w: sum(x for _, ww, x in two.rates if ww == w) for w in ("chat", "chat2")}
    assert served["chat"] == pytest.approx(2 * served["chat2"], rel=1e-6)
