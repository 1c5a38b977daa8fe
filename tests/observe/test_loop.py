"""The observe -> build --observed loop against a simulated fleet (testing/fleet.py) whose true step
times are 0.6x the plan's model (issue 34): the correction finds the speed, the replan rents fewer
GPUs and predicts what the fleet then shows, a doubled demand gets capacity, and missing or
malformed metrics are said, not filled."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import ROOT
from hetcompile.driver import compile_spec
from hetcompile.backends.emit import write
from hetcompile.observe.observe import ScrapeError, http_fetch
from hetcompile.observe.run import dumps_observed, observe_out, read_observed, read_table
from hetcompile.plan.io import read_plan_doc
from hetcompile.testing.fleet import SimulatedFleet

SPEC = ROOT / "tests" / "observe" / "spec_l4.yaml"
TRUE_SPEED = 0.6


def _build(out: Path, observed=None) -> Path:
    write(compile_spec(SPEC, verify=False, observed=observed).ir, out)
    return out


def _observe(out: Path, fleet: SimulatedFleet, window: float = 600.0):
    table = read_table(out)
    table = table.model_copy(update={"replicas": tuple(r.model_copy(update={"endpoint": f"http://fleet.invalid/{r.id}"})
                                                       for r in table.replicas)})
    return observe_out(out, window, 15.0, "http://fleet.invalid/router", fetch=fleet.fetch, clock=fleet.clock,
                       sleep=fleet.sleep, table=table)


@pytest.fixture(scope="module")
def first(tmp_path_factory) -> tuple[Path, object]:
    out = _build(tmp_path_factory.mktemp("v1") / "out")
    doc = _observe(out, SimulatedFleet(read_plan_doc(out), speed=TRUE_SPEED, duration=600.0))
    (out / "observed.yaml").write_text(dumps_observed(doc))
    return out, doc


def test_observe_finds_the_fleets_true_speed_and_rates(first) -> None:
    out, doc = first
    plan = read_plan_doc(out)
    assert [(c.gpu, c.tp) for c in doc.corrections] == sorted({(r.stages[0].gpu, r.tp) for r in plan.replicas})
    for c in doc.corrections:
        assert c.factor == pytest.approx(TRUE_SPEED, rel=0.1)
    served = {w.name: w.served_requests_per_s for w in plan.workloads}
    for w in doc.workloads:
        assert w.rate_per_s == pytest.approx(served[w.name], rel=0.1)
    assert not doc.missing
    assert dumps_observed(read_observed(out / "observed.yaml")) == (out / "observed.yaml").read_text()  # round trip through YAML


def test_replanning_with_the_observation_rents_less_and_predicts_what_the_fleet_shows(first, tmp_path) -> None:
    out, _ = first
    old = read_plan_doc(out)
    new_out = _build(tmp_path / "v2", read_observed(out / "observed.yaml"))
    new = read_plan_doc(new_out)
    assert sum(r.tp * r.pp for r in new.replicas) < sum(r.tp * r.pp for r in old.replicas)
    assert new.observed is not None and "## Observed" in (new_out / "plan.md").read_text()
    # the fleet runs the new plan at the same true speed: relative to the corrected model that is TRUE_SPEED / k
    k = new.observed.corrections[0].factor
    doc = _observe(new_out, SimulatedFleet(new, speed=TRUE_SPEED / k, duration=600.0, seed=1))
    # observed again, the replanned fleet runs at the corrected model's speed: every replica's factor
    # near 1, and what the corrected model predicts at the fleet's load is what the replicas show
    for r in doc.replicas:
        assert r.correction == pytest.approx(1.0, rel=0.1), r.id
        assert r.itl_s is not None and r.predicted_itl_s is not None
        assert r.predicted_itl_s == pytest.approx(r.itl_s.mean, rel=0.1), r.id


def test_a_doubled_demand_gets_capacity_in_the_next_cycle(first, tmp_path) -> None:
    out, _ = first
    plan = read_plan_doc(out)
    doc = _observe(out, SimulatedFleet(plan, speed=TRUE_SPEED, demand={"chat": 2.0}, duration=600.0, seed=2))
    rates = {w.name: w.rate_per_s for w in doc.workloads}
    served = {w.name: w.served_requests_per_s for w in plan.workloads}
    assert rates["chat"] == pytest.approx(2 * served["chat"], rel=0.1)
    new = read_plan_doc(_build(tmp_path / "v3", doc))
    chat = next(w for w in new.workloads if w.name == "chat")
    assert chat.served_requests_per_s == pytest.approx(rates["chat"], rel=1e-3)


def test_missing_and_malformed_metrics_are_listed_not_filled(first) -> None:
    out, _ = first
    plan = read_plan_doc(out)
    fleet = SimulatedFleet(plan, speed=TRUE_SPEED, duration=120.0, down={plan.replicas[0].id}, garbled={"router"})
    doc = _observe(out, fleet, window=120.0)
    text = "\n".join(doc.missing)
    assert f"{plan.replicas[0].id}: unreachable" in text and "router: malformed /metrics" in text
    assert all(w.rate_per_s is None for w in doc.workloads)
    assert plan.replicas[0].id not in {r.id for r in doc.replicas if r.scrapes}


def test_a_replica_that_answers_401_says_how_to_pass_the_key() -> None:
    import http.server
    import threading

    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            self.send_response(401)
            self.end_headers()

        def log_message(self, *a) -> None:
            pass

    srv = http.server.HTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        with pytest.raises(ScrapeError, match="HC_VLLM_API_KEY"):
            http_fetch(f"http://127.0.0.1:{srv.server_port}/metrics", {})
    finally:
        srv.shutdown()
