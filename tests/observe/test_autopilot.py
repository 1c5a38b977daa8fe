"""hetcompile/autopilot.py: the closed loop against the simulated fleet (testing/fleet.py) and the
recording stub `sky`. A steady fleet with noisy metrics makes no change in 20 cycles; a fleet that
runs faster than the model is replanned onto fewer GPUs and `deploy` converges to the new plan, and
a doubled demand is held within the minimum interval, then planned for and deployed;
--dry-run and the minimum interval change nothing."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import ROOT
from hetcompile.autopilot import Autopilot, Damping, decide
from hetcompile.backends.emit import write
from hetcompile.driver import compile_spec
from hetcompile.observe.run import observe_out, read_table
from hetcompile.plan.io import read_plan_doc
from hetcompile.testing.fleet import SimulatedFleet
from test_deploy import _env
from test_deploy_reconcile import _converged

SPEC = ROOT / "tests" / "observe" / "spec_l4.yaml"


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("pilot") / "out"
    write(compile_spec(SPEC, verify=False).ir, out)
    return out


def _copy(built: Path, tmp: Path) -> Path:
    out = tmp / "out"
    shutil.copytree(built, out)
    return out


def _observer(out: Path, speed: float, window: float, seeds: list[int], garbled: frozenset[str] = frozenset(),
              demands: list[dict[str, float]] | None = None):
    """Each call observes a fresh simulated fleet running OUT's plan (the next seed: new noise; the
    next of `demands`: each workload's demand as a multiple of the spec's)."""
    spec_rates = {w.name: w.demand for w in read_plan_doc(out).workloads}

    def observe(previous):
        plan = read_plan_doc(out)
        want = demands.pop(0) if demands else {}
        # the fleet's demand is the users', not the plan's: relative to what OUT's plan now serves
        demand = {w.name: want.get(w.name, 1.0) * spec_rates[w.name] / w.served_requests_per_s for w in plan.workloads}
        fleet = SimulatedFleet(plan, speed=speed, demand=demand, duration=window, seed=seeds.pop(0), garbled=set(garbled))
        table = read_table(out)
        table = table.model_copy(update={"replicas": tuple(r.model_copy(update={"endpoint": f"http://fleet.invalid/{r.id}"})
                                                           for r in table.replicas)})
        return observe_out(out, window, 15.0, "http://fleet.invalid/router", fetch=fleet.fetch, clock=fleet.clock,
                           sleep=fleet.sleep, previous=previous, table=table)
    return observe


def _build(spec: Path, obs, previous: Path, out: Path, churn: float) -> None:
    write(compile_spec(spec, previous=previous, churn_penalty=churn, observed=obs, verify=False).ir, out)


def _no_deploy(out: Path) -> int:
    raise AssertionError("deploy was called")


def test_a_steady_fleet_with_noisy_metrics_makes_no_change_in_20_cycles(built, tmp_path) -> None:
    out = _copy(built, tmp_path)
    builds: list[Path] = []
    pilot = Autopilot(out, SPEC, _observer(out, 1.0, 300.0, list(range(20))), lambda *a: builds.append(a[3]), _no_deploy,
                      Damping(dead_band=0.2, min_interval_s=0.0))
    lines = [pilot.cycle() for _ in range(20)]
    assert not builds, lines
    assert all("| steady |" in line for line in lines)
    assert len((out / "autopilot.log").read_text().splitlines()) == 20


def test_a_faster_fleet_is_replanned_onto_fewer_gpus_and_deploy_converges(built, tmp_path) -> None:
    env = _env(tmp_path)
    out = _copy(built, tmp_path)

    def deploy(o: Path) -> int:
        p = subprocess.run(["hetcompile", "deploy", str(o), "--health-poll", "0.01"], env=env, capture_output=True, text=True,
                           cwd=tmp_path)
        assert p.returncode == 0, p.stdout + p.stderr
        return p.returncode

    deploy(out)  # the fleet runs plan v1
    gpus = lambda: sum(r.tp * r.pp for r in read_plan_doc(out).replicas)  # noqa: E731
    before = gpus()
    clock = iter([1000.0, 1100.0, 5000.0])
    pilot = Autopilot(out, SPEC, _observer(out, 0.6, 600.0, [0, 1, 2], demands=[{}, {"chat": 2.0}, {"chat": 2.0}]), _build, deploy,
                      Damping(min_interval_s=3600.0), clock=lambda: next(clock))
    line = pilot.cycle()
    assert "| replan: L4 TP1 step times 1x -> 0.6" in line and "deployed" in line, line
    after = read_plan_doc(out)
    assert after.observed is not None and gpus() < before
    _converged(tmp_path, out)
    # chat's demand doubles: within the minimum interval of the change the drift is held ...
    assert "| held: chat rate " in pilot.cycle()
    # ... and after it the next cycle plans and deploys capacity for it
    line = pilot.cycle()
    assert "| replan: chat rate " in line and "deployed" in line, line
    chat = next(w for w in read_plan_doc(out).workloads if w.name == "chat")
    assert chat.served_requests_per_s == pytest.approx(16.0, rel=0.1) and gpus() > 5
    _converged(tmp_path, out)


def test_dry_run_builds_beside_out_and_changes_nothing(built, tmp_path) -> None:
    out = _copy(built, tmp_path)
    plan = (out / "plan.json").read_text()
    pilot = Autopilot(out, SPEC, _observer(out, 0.6, 600.0, [0]), _build, _no_deploy, Damping(), dry_run=True)
    line = pilot.cycle()
    assert "would deploy" in line and (out.parent / "out.next" / "plan.json").is_file()
    assert (out / "plan.json").read_text() == plan


def test_drift_within_the_minimum_interval_is_held(built) -> None:
    plan = read_plan_doc(built)
    obs = _observer(built, 0.6, 600.0, [0])(None)
    assert decide(plan, obs, now=100.0, last_change=0.0, damping=Damping(min_interval_s=1800.0)).action == "held"
    assert decide(plan, obs, now=2000.0, last_change=0.0, damping=Damping(min_interval_s=1800.0)).action == "replan"


def test_a_window_with_unreadable_metrics_changes_nothing_and_says_why(built, tmp_path) -> None:
    out = _copy(built, tmp_path)
    builds: list[Path] = []
    pilot = Autopilot(out, SPEC, _observer(out, 0.6, 300.0, [0], garbled=frozenset({"router"})), lambda *a: builds.append(a[3]),
                      _no_deploy, Damping(min_interval_s=0.0))
    line = pilot.cycle()
    assert not builds and "| incomplete: router: malformed /metrics" in line, line
