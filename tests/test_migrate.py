"""`hetcompile migrate OLD NEW` against the recording stub `sky`: the old plan is deployed with its own
deploy.sh, then the explain migration runs step by step (a real /health server for the launched
replica); a launch failure midway and a teardown failure stop it, say what runs, and a re-run
skips what was done."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from conftest import ROOT
from hetcompile.backends.emit import write
from hetcompile.driver import compile_spec
from hetcompile.migrate.actions import RolloutError, rollout_plan
from hetcompile.migrate.run import Runner
from hetcompile.testing.health import health_server
from test_deploy import _calls, _clusters, _env


def _build(tmp: Path, spec: Path, name: str, previous: Path | None = None) -> Path:
    out = tmp / name
    write(compile_spec(spec, previous=previous, verify=False).ir, out)  # migrate reads plans; how they were verified is not its concern
    return out


@pytest.fixture(scope="module")
def plans(tmp_path_factory) -> tuple[Path, Path]:
    tmp = tmp_path_factory.mktemp("plans")
    old = _build(tmp, ROOT / "examples" / "quickstart" / "spec.yaml", "old")
    new = _build(tmp, ROOT / "tests" / "explain_cases" / "quickstart-budget-cut.yaml", "new", old / "plan.json")
    return old, new


def _deployed(tmp: Path, plans: tuple[Path, Path]) -> tuple[Path, Path, dict]:
    import shutil

    old, new = (tmp / "old", tmp / "new")
    shutil.copytree(plans[0], old)
    shutil.copytree(plans[1], new)
    env = _env(tmp)
    env["HF_TOKEN"] = "hf-test"
    p = subprocess.run(["bash", str(old / "deploy.sh")], env=env, capture_output=True, text=True, cwd=tmp)
    assert p.returncode == 0, p.stderr
    return old, new, env


def _run(old: Path, new: Path, env: dict, probe=lambda url: True, **kw) -> tuple[int, str]:
    lines: list[str] = []
    rc = Runner(rollout_plan(old, new), env=env, probe=probe, drain_s=0, poll=0, log=lines.append,
                sleep=lambda s: None, **kw).run()
    return rc, "\n".join(lines)


def test_full_migration(tmp_path: Path, plans) -> None:
    old, new, env = _deployed(tmp_path, plans)
    ro = rollout_plan(old, new)
    assert [a.kind for a in ro.actions] == ["drain", "teardown", "launch", "route"]
    # the launched replica answers /health on a real port: the default probe (HTTP GET) is used
    with health_server() as addr:
        (tmp_path / "sky-state" / "endpoints.json").write_text(json.dumps({"quickstart-r4": addr}))
        lines: list[str] = []
        rc = Runner(ro, env=env, drain_s=0, poll=0.01, health_timeout=10, log=lines.append).run()
    text = "\n".join(lines)
    assert rc == 0, text
    assert "[3/4] launch: launched, healthy" in text and "migrate: done" in text
    assert sorted(_clusters(tmp_path)) == ["quickstart-r0", "quickstart-r1", "quickstart-r3", "quickstart-r4", "quickstart-router"]
    n0 = next(i for i, c in enumerate(_calls(tmp_path)) if c[:1] == ["exec"])
    acts = [(c[0], c[-1] if c[0] == "down" else c[c.index("-c") + 1] if c[0] == "launch" else c[1])
            for c in _calls(tmp_path)[n0:] if c[0] in ("launch", "down", "exec")]
    assert acts == [("exec", "quickstart-router"), ("down", "quickstart-r2"), ("launch", "quickstart-r4"),
                    ("exec", "quickstart-router")]
    launch = next(c for c in _calls(tmp_path)[n0:] if c[:1] == ["launch"])
    assert launch[launch.index("-c") + 2] == "sky/r4.yaml" and "--secret" in launch and "HF_TOKEN" in launch
    # what the router got at each route/drain: step 1 drains old r2, step 4 adds new r4
    tables = [json.loads((tmp_path / "sky-state" / "exec" / str(i) / "routing.json").read_text()) for i in range(1, 3)]
    assert [sorted(r["id"] for r in t["replicas"]) for t in tables] == [["r0", "r1", "r3"], ["r0", "r1", "r3", "r4"]]
    assert all(r["endpoint"] for t in tables for r in t["replicas"])
    r4 = next(r for r in tables[1]["replicas"] if r["id"] == "r4")
    assert r4["endpoint"] == f"http://{addr}"
    # the final table is the new plan's own, endpoints filled in, and NEW/router/routing.json says so
    final = json.loads((new / "router" / "routing.json").read_text())
    assert tables[-1] == final and final["models"] == json.loads((plans[1] / "router" / "routing.json").read_text())["models"]
    # the router token reached sky as a managed secret, never on a command line
    token = (old / "router.token").read_text().strip()
    execs = [c for c in _calls(tmp_path)[n0:] if c[:1] == ["exec"]]
    assert all(c[-2:] == ["--secret", "HC_ROUTER_TOKEN"] for c in execs)
    assert token not in json.dumps(_calls(tmp_path))
    # a second run does nothing: every step is recorded as done
    n1 = len(_calls(tmp_path))
    rc, text = _run(old, new, env)
    assert rc == 0 and text.count("done in an earlier run, skipped") == 4 and len(_calls(tmp_path)) == n1


def test_reload_task_loads_with_skypilot(tmp_path: Path, plans) -> None:
    from hetcompile.testing import sky_check

    old, new, env = _deployed(tmp_path, plans)
    rc, _ = _run(old, new, env)
    assert rc == 0
    import os

    cwd = os.getcwd()
    os.chdir(new)  # the workdir is relative to where sky runs, as the runner runs it
    try:
        task = sky_check.load_task(new / "migrate" / "reload.yaml")
    finally:
        os.chdir(cwd)
    assert task.name == "quickstart-router-reload" and task.run.startswith("python3 -c")


def test_launch_failure_midway_then_rerun(tmp_path: Path, plans) -> None:
    old, new, env = _deployed(tmp_path, plans)
    (tmp_path / "sky-state" / "fail_launch").write_text("quickstart-r4\n")
    rc, text = _run(old, new, env)
    assert rc == 1
    assert "migrate FAILED at step 3 (launch): `sky launch -y -d -c quickstart-r4 sky/r4.yaml --secret HC_VLLM_API_KEY --secret HF_TOKEN` failed" in text
    assert "running (billing): quickstart-r0, quickstart-r1, quickstart-r3; and quickstart-r4 may be partly up" in text
    assert "serves the table of step 1" in text
    assert f"re-run `hetcompile migrate {old} {new}`" in text
    assert "sky down -y quickstart-r4" in text
    assert "quickstart-r2" not in _clusters(tmp_path) and "quickstart-r3" in _clusters(tmp_path)
    (tmp_path / "sky-state" / "fail_launch").write_text("")
    n0 = len(_calls(tmp_path))
    rc, text = _run(old, new, env)
    assert rc == 0, text
    assert "[1/4] drain old r2: out of the routing table, wait for its in-flight requests: done in an earlier run, skipped" in text
    again = [c for c in _calls(tmp_path)[n0:] if c[:1] in (["launch"], ["down"])]
    assert [c[0] for c in again] == ["launch"]  # r2 not torn down twice, r4 launched once
    assert sorted(_clusters(tmp_path)) == ["quickstart-r0", "quickstart-r1", "quickstart-r3", "quickstart-r4", "quickstart-router"]


def test_rerun_skips_clusters_sky_shows_done(tmp_path: Path, plans) -> None:
    """Without the journal (deleted, or steps done by hand) launch and teardown still skip by `sky status`."""
    old, new, env = _deployed(tmp_path, plans)
    assert _run(old, new, env)[0] == 0
    (new / "migrate" / "state.json").unlink()
    n0 = len(_calls(tmp_path))
    rc, text = _run(old, new, env)
    assert rc == 0, text
    assert "launch: already UP, not relaunched, healthy" in text and text.count("teardown: already down") == 1
    assert not [c for c in _calls(tmp_path)[n0:] if c[:1] in (["launch"], ["down"])]


def test_teardown_failure_then_rerun(tmp_path: Path, plans) -> None:
    old, new, env = _deployed(tmp_path, plans)
    (tmp_path / "sky-state" / "fail_down").write_text("quickstart-r2\n")
    rc, text = _run(old, new, env)
    assert rc == 1
    assert "migrate FAILED at step 2 (teardown): `sky down -y quickstart-r2` failed; quickstart-r2 may still be running and billing" in text
    assert "running (billing): quickstart-r0, quickstart-r1, quickstart-r2, quickstart-r3" in text
    (tmp_path / "sky-state" / "fail_down").write_text("")
    n0 = len(_calls(tmp_path))
    rc, text = _run(old, new, env)
    assert rc == 0 and text.count("skipped") == 1  # the drain; the teardown is retried, then the rest runs
    rest = [c for c in _calls(tmp_path)[n0:] if c[:1] != ["status"]]
    assert rest[0] == ["down", "-y", "quickstart-r2"] and [c[0] for c in rest] == ["down", "launch", "exec"]


def test_health_timeout_names_replica_and_logs(tmp_path: Path, plans) -> None:
    old, new, env = _deployed(tmp_path, plans)
    rc, text = _run(old, new, env, probe=lambda url: False, health_timeout=0)
    assert rc == 1
    assert "quickstart-r4 not healthy after 0s (GET http://127.0.0.1:" in text and "/health); its logs: sky logs quickstart-r4" in text


def test_router_refusal_stops(tmp_path: Path, plans) -> None:
    old, new, env = _deployed(tmp_path, plans)
    (tmp_path / "sky-state" / "fail_exec").write_text("quickstart-router\n")
    rc, text = _run(old, new, env)
    assert rc == 1 and "FAILED at step 1 (drain): the router did not take the table" in text
    assert "sky logs quickstart-router" in text
    assert not [c for c in _calls(tmp_path) if c[:1] == ["down"]]  # nothing torn down before the router drained it


def test_preflight_missing_token_changes_nothing(tmp_path: Path, plans) -> None:
    old, new, env = _deployed(tmp_path, plans)
    (old / "router.token").unlink()
    env.pop("HC_ROUTER_TOKEN", None)
    n0 = len(_calls(tmp_path))
    rc, text = _run(old, new, env)
    assert rc == 2 and "HC_ROUTER_TOKEN is not set in the environment or in" in text
    assert len(_calls(tmp_path)) == n0


def test_reused_cluster_name_is_refused(tmp_path: Path, plans) -> None:
    """A new plan built without --previous reuses ids: launching it would land on a running cluster."""
    new = _build(tmp_path, ROOT / "tests" / "explain_cases" / "quickstart-budget-cut.yaml", "new-fresh")
    with pytest.raises(RolloutError, match="would launch as cluster quickstart-r3, which already runs"):
        rollout_plan(plans[0], new)


def test_cli_dry_run(tmp_path: Path, plans) -> None:
    from typer.testing import CliRunner

    from hetcompile.cli import app

    r = CliRunner().invoke(app, ["migrate", str(plans[0]), str(plans[1]), "--dry-run"])
    assert r.exit_code == 0, r.output
    assert "rolling, 4 steps" in r.output and "sky launch -y -d -c quickstart-r4 sky/r4.yaml --secret HC_VLLM_API_KEY --secret HF_TOKEN" in r.output
    assert not (plans[1] / "migrate").exists()


def test_mixed_job_groups_are_refused(tmp_path: Path) -> None:
    from test_place_pass import write_spec

    out = tmp_path / "mixed"
    write(compile_spec(write_spec(tmp_path), verify=False).ir, out)
    with pytest.raises(RolloutError, match="does not handle mixed-GPU Job Groups"):
        rollout_plan(out, out)


def _drain_run(tmp: Path, plans, metrics, drain_s: float) -> tuple[int, str, list[float], list[dict]]:
    """The migration with every replica endpoint on one stand-in whose /metrics is `metrics()`;
    returns the exit code, the log, the drain sleeps and the headers /metrics was read with."""
    from hetcompile.migrate import run as rollout_run

    old, new, env = _deployed(tmp, plans)
    sleeps: list[float] = []
    seen: list[dict] = []

    def inflight(url: str, headers: dict[str, str]) -> float | None:
        seen.append(headers)
        return rollout_run.in_flight(url, headers)

    with health_server(metrics) as addr:
        (tmp / "sky-state" / "endpoint_default").write_text(addr)
        lines: list[str] = []
        rc = Runner(rollout_plan(old, new), env=env, drain_s=drain_s, poll=0.01, health_timeout=10, log=lines.append,
                    sleep=sleeps.append, inflight=inflight).run()
    return rc, "\n".join(lines), sleeps, seen


def _gauges(running: float, waiting: float = 0.0) -> str:
    return ("# TYPE vllm:num_requests_running gauge\n"
            f'vllm:num_requests_running{{engine="0",model_name="m"}} {running}\n'
            "# TYPE vllm:num_requests_waiting gauge\n"
            f'vllm:num_requests_waiting{{engine="0",model_name="m"}} {waiting}\n'
            f'vllm:num_requests_waiting_by_reason{{engine="0",model_name="m",reason="capacity"}} 7.0\n')


def test_drain_waits_until_the_replica_is_idle(tmp_path: Path, plans) -> None:
    """Drain reads the replica's vLLM gauges over HTTP and stops waiting once running + waiting is 0."""
    reads = iter([_gauges(2, 1), _gauges(1), _gauges(0)] + [_gauges(0)] * 10)
    rc, text, sleeps, seen = _drain_run(tmp_path, plans, lambda: next(reads), drain_s=60)
    assert rc == 0, text
    assert "[1/4] drain: router serves r0, r1, r3; drained: no request in flight after 4s" in text
    assert sleeps == [2.0, 2.0]  # two polls of DRAIN_POLL_S, far below the 60 s limit
    assert seen and all(h["Authorization"].startswith("Bearer ") for h in seen)  # the replicas' key, from deploy


def test_drain_limit_says_what_is_left(tmp_path: Path, plans) -> None:
    rc, text, sleeps, _ = _drain_run(tmp_path, plans, lambda: _gauges(3), drain_s=5)
    assert rc == 0, text
    assert "drain: router serves r0, r1, r3; 3 request(s) still in flight after the 5s drain limit, going on" in text
    assert sleeps == [2.0, 2.0, 1.0]  # the limit is the sum of the waits (one drain step)


def test_drain_without_metrics_waits_the_whole_limit(tmp_path: Path, plans) -> None:
    rc, text, sleeps, _ = _drain_run(tmp_path, plans, None, drain_s=3)  # /metrics is 404
    assert rc == 0, text
    assert "in-flight count unknown (no http://127.0.0.1:" in text and "/metrics) after the 3s drain limit" in text
    assert sleeps == [2.0, 1.0]
