"""`hetcompile explain`: explanations and plan diffs, their goldens, schema, migration replay, CLI.

Goldens live in tests/golden/explain/ (`pytest --update-golden` rewrites them, on purpose only):
`<example>.md` / `<example>.json` for every example, and `diff-<case>.md` / `.json` for the
spec variants in tests/explain_cases/ (a budget cut, a lost GPU offer, a workload shift), each
diffed against the example it varies. The migration of every case is replayed step by step.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

import pytest
from typer.testing import CliRunner

from conftest import ROOT, build
from hetcompile.plan.canon import canon, dumps_json
from hetcompile.backends.plan_json import plan_dict
from hetcompile.cli import app
from hetcompile.explain import explain_plan
from hetcompile.migrate.planner import plan_diff, replay
from hetcompile.explain import rates
from hetcompile.explain.load import PlanReadError, check_plan
from hetcompile.migrate.planner import MigrationError
from hetcompile.explain.model import ADAPTER, Step, Unit
from hetcompile.plan.doc import PlanDoc
from hetcompile.plan.doc import ChainSummary, ModelPlacement
from hetcompile.explain.render import render_diff, render_explanation, text

# the examples this file has goldens for (a new example needs its goldens made on purpose)
EXAMPLES = ("cost-efficiency-appc", "hetis-cluster", "llama70b-pp", "quickstart", "three-regions", "tiny-cpu")
CASES = {  # case -> (old spec, new spec)
    "budget-cut": ("examples/quickstart/spec.yaml", "tests/explain_cases/quickstart-budget-cut.yaml"),
    "lost-a100": ("examples/quickstart/spec.yaml", "tests/explain_cases/quickstart-lost-a100.yaml"),
    "workload-shift": ("examples/quickstart/spec.yaml", "tests/explain_cases/quickstart-workload-shift.yaml"),
}
GOLDEN = ROOT / "tests" / "golden" / "explain"


@lru_cache(maxsize=None)
def _plan_text(rel: str) -> str:
    """An example's plan.json is its golden (tests/golden/<example>/plan.json, which test_examples.py
    pins to what the build writes): explain is tested on the document, and this file builds only
    the specs it owns (the explain cases)."""
    parts = Path(rel).parts
    if parts[0] == "examples" and parts[-1] == "spec.yaml":
        return (ROOT / "tests" / "golden" / parts[1] / "plan.json").read_text()
    return dumps_json(plan_dict(build(ROOT / rel).ir))


def diff_plans(old, new):
    return plan_diff(old, new)


def plan_of(rel: str) -> PlanDoc:
    """The canonical plan.json of a spec as `hetcompile build` writes it, read back as explain reads it."""
    return check_plan(json.loads(_plan_text(rel)))


def example(name: str) -> PlanDoc:
    return plan_of(f"examples/{name}/spec.yaml")


def check_golden(name: str, got: str, update: bool) -> None:
    path = GOLDEN / name
    if update:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(got)
    assert path.exists(), f"no golden {path} (pytest --update-golden to create it)"
    assert got == path.read_text(), f"explain/{name} differs from golden (pytest --update-golden to accept)"


def diff_case(case: str):
    old_rel, new_rel = CASES[case]
    old, new = plan_of(old_rel), plan_of(new_rel)
    return old, new, diff_plans(old, new)


# ---------------------------------------------------------------------------- goldens


@pytest.mark.parametrize("name", EXAMPLES)
def test_explain_golden(name: str, update_golden: bool) -> None:
    e = explain_plan(example(name))
    check_golden(f"{name}.md", render_explanation(e, "md"), update_golden)
    check_golden(f"{name}.json", render_explanation(e, "json"), update_golden)


@pytest.mark.parametrize("case", sorted(CASES))
def test_diff_golden(case: str, update_golden: bool) -> None:
    old, new, d = diff_case(case)
    check_golden(f"diff-{case}.md", render_diff(d, "md", explain_plan(old), explain_plan(new)), update_golden)
    check_golden(f"diff-{case}.json", render_diff(d, "json", explain_plan(old), explain_plan(new)), update_golden)


@pytest.mark.parametrize("name", EXAMPLES)
def test_same_plan_same_bytes(name: str) -> None:
    a = render_explanation(explain_plan(example(name)), "json")
    assert a == render_explanation(explain_plan(example(name)), "json")


# ---------------------------------------------------------------------------- explain


@pytest.mark.parametrize("name", EXAMPLES)
def test_utilisation_matches_the_plans_rates(name: str) -> None:
    """U_r recomputed by hand: routed rate over capacity, summed over workloads; compose keeps it <= 1."""
    plan = example(name)
    e = explain_plan(plan)
    served = {w.name: w.served_requests_per_s for w in plan.workloads}
    routing = plan.model_dump(mode="json")["routing"]  # plain dicts: the hand computation owes nothing to rates.py
    for r, v in zip(sorted(plan.replicas, key=lambda r: r.id), e.replicas):
        u = sum(routing.get(w, {}).get(r.id, 0) * s / r.workloads[w].capacity_requests_per_s
                for w, s in served.items() if routing.get(w, {}).get(r.id, 0) > 0)
        assert v.utilisation == pytest.approx(u)
        assert v.utilisation <= 1 + 1e-4
        assert [s.layers for s in v.stages] == [s.layers for s in r.stages]
    cost = e.cost
    assert sum(o.price_per_hour for o in cost.by_offer) == pytest.approx(plan.totals.price_per_hour, abs=0.01)
    assert [b.text for b in e.binding if not b.derived] == [b.text for b in plan.totals.binding]


def test_binding_names_the_offer_and_budget() -> None:
    e = explain_plan(example("three-regions"))
    kinds = {(b.kind, b.subject) for b in e.binding}
    assert ("budget", None) in kinds and ("availability", "us-central1/L4x2") in kinds


def test_measured_estimates_are_marked() -> None:
    e = explain_plan(example("cost-efficiency-appc"))
    assert [g.source for g in e.estimates] == ["measured"]
    assert all(ld.bottleneck.kind == "measured" for r in e.replicas for ld in r.workloads)
    assert e.summary.makespan_s is not None


def test_pictures_have_every_replica() -> None:
    e = explain_plan(example("llama70b-pp"))
    md = render_explanation(e, "md")
    assert "```mermaid\nflowchart LR" in md
    dot = render_explanation(e, "dot")
    assert dot.startswith('digraph "llama70b-pp" {') and dot.count("{") == dot.count("}")
    for r in e.replicas:
        assert f'"cluster_p_{r.id}"' in dot and f"subgraph r_{r.id}[" in md


def test_placement_block_is_shown_and_unknown_keys_are_refused() -> None:
    plan = example("quickstart")
    chain = ChainSummary(replica="r0", depth=2, tp=1, concurrency=200.0, concurrency_limit="max-num-seqs", micro_batch=100.0,
                         capacity_tokens_per_s=900.0, binding="latency", helix_flow=950.0)
    block = ModelPlacement(model="llama-3.1-8b", objective="depth-aware", kept="compose", pool_nodes=2, pool_gpus=2, status="ok",
                           helix_flow=123.0, depth_aware_capacity=900.0, compose_depth_aware_capacity=800.0, scale_placement=1.0,
                           scale_compose=0.9, chains=(chain,))
    e = explain_plan(plan.model_copy(update={"placement": (block,)}))
    assert e.replicas[0].placement == chain.model_dump(mode="json", exclude={"replica"})
    assert e.replicas[0].placement["depth"] == 2 and e.replicas[0].placement["binding"] == "latency"
    md = render_explanation(e, "md")
    assert "## Placement" in md and "placement: depth 2, concurrency 200, concurrency_limit max-num-seqs" in md
    assert "- **llama-3.1-8b**: " in md and "helix_flow 123" in md and "| binding | binding_node | capacity_tokens_per_s |" in md
    out = json.loads(render_explanation(e, "json"))
    assert out["placement"] == [block.model_dump(mode="json")]  # as plan.json has it
    ADAPTER.validate_json(render_explanation(e, "json"))
    # a plan.json with keys this version does not know is refused when read, naming the key
    data = plan.model_dump(mode="json")
    data["replicas"][0]["future_key"] = {"x": 1}
    with pytest.raises(PlanReadError, match=r"replicas\[0\]\.future_key"):
        check_plan(data)


# ---------------------------------------------------------------------------- diff


@pytest.mark.parametrize("name", EXAMPLES)
def test_diff_with_self_is_empty(name: str) -> None:
    d = diff_plans(example(name), example(name))
    assert d.empty and not d.changed and not d.added and not d.removed and not d.routing and not d.totals
    assert all(not p.relabelled for p in d.untouched) and len(d.untouched) == len(example(name).replicas)
    assert d.migration.mode == "none" and d.migration.steps == () and d.migration.capacity_kept


def test_budget_cut_cannot_run_side_by_side() -> None:
    old, new, d = diff_case("budget-cut")
    m = d.migration
    assert m.mode == "rolling" and m.ceiling_per_hour == pytest.approx(old.totals.price_per_hour)
    assert any(c.startswith("budget:") and "exceeds it" in c for c in m.checks)
    assert new.totals.budget_per_hour < old.totals.price_per_hour
    assert {p.old for p in d.untouched} and any(p.relabelled for p in d.untouched)
    # an A100 replica gives way to a cheaper two-L4 pipeline (shapes as of the fitted catalog)
    assert [r.id for r in d.removed] == ["r2"] and [r.shape for r in d.added] == ["llama-3.1-8b|us-central1/L4x1|tp1|pp2"]


def test_lost_offer_dip_is_said_plainly() -> None:
    _, _, d = diff_case("lost-a100")
    m = d.migration
    assert not m.capacity_kept and m.dips
    assert any(c.startswith("capacity:") and "drops to" in c for c in m.checks)
    assert {o.offer: o.status for o in d.offers}["us-central1/A100x1"] == "changed"  # 3 -> 2 A100s


def test_workload_shift_only_moves_weights() -> None:
    _, _, d = diff_case("workload-shift")
    assert not (d.added or d.removed or d.changed or d.offers) and d.routing
    assert [s.action for s in d.migration.steps] == ["route"] and d.migration.capacity_kept
    assert {w.workload for w in d.workloads} == {"chat", "summarize"}


@pytest.mark.parametrize("case", sorted(CASES))
def test_migration_replay_keeps_capacity(case: str) -> None:
    """Replay every step; capacity >= min(old, new) per workload, or the dip is reported there."""
    old, new, d = diff_case(case)
    m = d.migration
    states = replay(old, new, m.steps)
    k_old, k_new = rates.plan_capacity(old), rates.plan_capacity(new)
    assert states[0].capacity == pytest.approx(k_old)
    assert states[0].price_per_hour == pytest.approx(old.totals.price_per_hour, abs=0.01)
    dips = {(x.step, x.workload) for x in m.dips}
    for st in states[1:]:
        step = m.steps[st.index - 1]
        assert {c.workload: c.requests_per_s for c in step.capacity} == pytest.approx(st.capacity)
        assert step.price_per_hour == pytest.approx(st.price_per_hour)
        if m.ceiling_per_hour is not None:
            assert st.price_per_hour <= m.ceiling_per_hour + 1e-6
        for w, cap in st.capacity.items():
            target = min(k_old.get(w, 0.0), k_new.get(w, 0.0))
            below = cap < target * (1 - 1e-6) - 1e-9
            assert below == ((st.index, w) in dips), f"step {st.index} {w}: {cap} vs target {target}"
    end = states[-1]
    assert sorted(u.new for u in end.running) == sorted(r.id for r in new.replicas)
    assert set(end.routed.values()) == {"new"} and len(end.routed) == len(new.replicas)
    assert end.capacity == pytest.approx(k_new)
    assert end.price_per_hour == pytest.approx(new.totals.price_per_hour, abs=0.01)
    assert m.capacity_kept == (not dips)


# ---------------------------------------------------------------------------- small hand-made plans


def fake_plan(name: str, reps: list[tuple], budget: float | None) -> PlanDoc:
    """reps: (id, offer, gpu, nodes, partition, tp, price per node, capacity of 'chat'); at full load.
    A whole plan.json, validated as explain reads one (fields explain does not read are placeholders)."""
    nodes, replicas = [], []
    total = sum(r[7] for r in reps)
    for rid, offer, gpu, node_ids, part, tp, price, cap in reps:
        region = offer.split("/")[0]
        stages, start = [], 0
        for n, k in zip(node_ids, part):
            nodes.append({"id": n, "offer": offer, "gpu": gpu, "gpus": tp, "owned_gpus": 0, "region": region, "cloud": "gcp",
                          "owned": False, "price_per_hour": price})
            stages.append({"node": n, "gpu": gpu, "region": region, "tp": tp, "layers": [start, start + k]})
            start += k
        replicas.append({"id": rid, "model": "m", "served_name": "m", "shape": f"m|{offer}|tp{tp}|pp{len(part)}",
                         "stages": stages, "tp": tp, "pp": len(part), "partition": list(part), "mixed": False,
                         "dtype": "bfloat16", "estimate_source": "analytic", "price_per_hour": price * len(part),
                         "kv_capacity_tokens": 100000, "prefill_tokens_per_s": 1000.0, "decode_tokens_per_s": 100.0,
                         "workloads": {"chat": {"capacity_requests_per_s": cap, "concurrency": 10.0, "binding": "bottleneck-stage"}}})
    price = sum(n["price_per_hour"] for n in nodes)
    return check_plan(canon({
        "format": "hetcompile-plan/1", "compiler": {"version": "test", "solver": "none"},
        "plan": name, "spec_hash": name, "next_replica": len(reps), "passes": [],
        "models": [{"name": "m", "served_name": "m", "weights": "m", "max_model_len": 4096, "layers": 32}],
        "engine": {"max_num_seqs": 256, "gpu_memory_utilization": 0.9, "port": 8000, "router_port": 8080},
        "nodes": nodes, "replicas": replicas,
        "routing": {"chat": {r[0]: r[7] / total for r in reps}},
        "workloads": [{"name": "chat", "model": "m", "served_requests_per_s": total, "demand": 1.0, "demand_kind": "rate",
                       "input_tokens": 100.0, "output_tokens": 100.0}],
        "totals": {"binding": [], "price_per_hour": price, "budget_per_hour": budget, "requests_per_s": total,
                   "tokens_per_s": 200.0 * total, "output_tokens_per_s": 100.0 * total, "scale": 1.0,
                   "gpus": sum(n["gpus"] for n in nodes), "objective": "max-throughput", "objective_value": 1.0,
                   "objective_unit": "x demand", "bound": None, "gap": None, "bound_source": "none"},
    }))


def test_matching_renumbered_nodes_is_untouched_and_moved_layers_is_changed() -> None:
    old = fake_plan("p", [("r0", "a/L4x1", "L4", ["a-l4-0", "a-l4-1"], [16, 16], 1, 1.0, 4.0),
                          ("r1", "a/L4x1", "L4", ["a-l4-2", "a-l4-3"], [16, 16], 1, 1.0, 4.0)], None)
    new = fake_plan("p", [("r0", "a/L4x1", "L4", ["a-l4-0", "a-l4-1"], [20, 12], 1, 1.0, 3.0),
                          ("r1", "a/L4x1", "L4", ["a-l4-4", "a-l4-5"], [16, 16], 1, 1.0, 4.0)], None)
    d = diff_plans(old, new)
    assert [(p.old, p.new, p.relabelled) for p in d.untouched] == [("r0", "r1", True)]
    (ch,) = d.changed
    assert (ch.old, ch.new, ch.in_place) == ("r1", "r0", True)
    assert {c.field for c in ch.changes} == {"layers", "nodes"}
    # the same machines with another layer split: restarted in place (no provisioning) while the
    # untouched replica serves, so capacity dips but is never gone
    assert d.migration.mode == "in-place"
    assert [(s.action, s.unit.label if s.unit else None) for s in d.migration.steps] == [
        ("drain", "old r1"), ("restart", "new r0"), ("route", None), ("route", None)]
    assert all(c.requests_per_s > 0 for s in d.migration.steps for c in s.capacity)


def test_tp_change_is_not_in_place() -> None:
    old = fake_plan("p", [("r0", "a/L4x2", "L4", ["n0"], [32], 2, 2.0, 5.0)], None)
    new = fake_plan("p", [("r0", "a/L4x2", "L4", ["n0", "n1"], [16, 16], 1, 2.0, 6.0)], None)
    (ch,) = diff_plans(old, new).changed
    assert not ch.in_place and {c.field for c in ch.changes} >= {"tp", "pp", "layers"}


def test_unavoidable_dip_is_reported() -> None:
    """Budget for one replica only: the old one must go before the new one comes, capacity hits 0."""
    old = fake_plan("p", [("r0", "a/L4x1", "L4", ["a-l4-0"], [32], 1, 2.0, 10.0)], 2.0)
    new = fake_plan("p", [("r0", "b/A10Gx1", "A10G", ["b-a10g-0"], [32], 1, 2.0, 12.0)], 2.0)
    d = diff_plans(old, new)
    m = d.migration
    assert m.mode == "rolling" and not m.capacity_kept
    assert [s.action for s in m.steps] == ["drain", "teardown", "launch", "route"]
    assert [(x.step, x.requests_per_s, x.target) for x in m.dips] == [(1, 0.0, 10.0), (2, 0.0, 10.0), (3, 0.0, 10.0)]
    assert any("drops to 0 req/s" in c for c in m.checks)
    assert replay(old, new, m.steps)[-1].capacity == {"chat": pytest.approx(12.0)}


def test_replay_rejects_impossible_steps() -> None:
    old = fake_plan("p", [("r0", "a/L4x1", "L4", ["a-l4-0"], [32], 1, 2.0, 10.0)], None)
    bad = Step(index=1, action="teardown", unit=Unit(old="r0", new="r0"), text="", price_per_hour=0.0, capacity=())
    with pytest.raises(MigrationError, match="drain it first"):
        replay(old, old, [bad])


def test_plans_of_different_models_are_said_so() -> None:
    d = diff_plans(example("quickstart"), example("tiny-cpu"))
    assert any("different models" in n for n in d.notes)
    assert not d.untouched and not d.changed and d.added and d.removed


# ---------------------------------------------------------------------------- schema and CLI


def test_json_output_validates_against_the_schema() -> None:
    jsonschema = pytest.importorskip("jsonschema")
    schema = json.loads((ROOT / "schemas" / "explain.schema.json").read_text())
    docs = [render_explanation(explain_plan(example(n)), "json") for n in EXAMPLES]
    for case in CASES:
        old, new, d = diff_case(case)
        docs.append(render_diff(d, "json", explain_plan(old), explain_plan(new)))
    for doc in docs:
        jsonschema.validate(json.loads(doc), schema)
        ADAPTER.validate_json(doc)


def test_not_a_plan_is_a_clear_error() -> None:
    with pytest.raises(PlanReadError, match="not a hetcompile plan.json"):
        check_plan({"models": [], "replicas": []})


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    d = tmp_path_factory.mktemp("plans")
    (d / "old").mkdir()
    (d / "old" / "plan.json").write_text(_plan_text(CASES["budget-cut"][0]))
    (d / "new.json").write_text(_plan_text(CASES["budget-cut"][1]))
    return d / "old", d / "new.json"


@pytest.mark.parametrize("fmt", ["text", "md", "json", "dot"])
def test_cli_formats(built: tuple[Path, Path], fmt: str) -> None:
    old, new = built
    runner = CliRunner()
    one = runner.invoke(app, ["explain", str(old), "--format", fmt])
    two = runner.invoke(app, ["explain", str(old), str(new), "--format", fmt])
    assert one.exit_code == 0 and two.exit_code == 0, one.output + two.output
    if fmt == "json":
        assert json.loads(one.output)["kind"] == "explanation" and json.loads(two.output)["kind"] == "diff"
    elif fmt == "dot":
        assert one.output.startswith("digraph") and two.output.startswith("digraph")
    else:
        assert "What binds" in one.output and "Migration" in two.output


def test_cli_bad_inputs_print_no_traceback(tmp_path: Path) -> None:
    runner = CliRunner()
    (tmp_path / "routing.json").write_text('{"models": [], "replicas": []}')
    (tmp_path / "junk.json").write_text("not json")
    for args, needle in (
        ([str(tmp_path / "missing")], "cannot read plan"),
        ([str(tmp_path / "routing.json")], "is not a hetcompile plan.json"),
        ([str(tmp_path / "junk.json")], "is not JSON"),
        ([str(tmp_path / "junk.json"), "--format", "yaml"], "unknown format"),
    ):
        res = runner.invoke(app, ["explain", *args])
        assert res.exit_code == 1, res.output
        assert needle in res.output and "Traceback" not in res.output


def test_text_rendering_of_a_diff_names_the_steps() -> None:
    old, new, d = diff_case("budget-cut")
    out = text(render_diff(d, "text", explain_plan(old), explain_plan(new)))
    assert "Mode rolling" in out and "tear down old r2" in out
