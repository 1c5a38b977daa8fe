"""`hetcompile deploy OUT` as a reconciler, against the recording stub `sky` (every launch keeps the
task it got): deploy a plan, rebuild a changed spec into the same folder, deploy again -> exactly
the new plan's clusters run, each with its new task; a third run launches nothing; a run killed
between two steps converges when re-run; teardown leaves nothing up; a step that would leave a
workload with no capacity is refused unless --allow-capacity-gap."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from conftest import ROOT, build
from hetcompile.backends.emit import write
from hetcompile.driver import compile_spec
from hetcompile.migrate.diff import DeployError, Launched, Record, task_hash
from test_deploy import _calls, _clusters, _env

QUICKSTART = ROOT / "examples" / "quickstart" / "spec.yaml"
BUDGET_CUT = ROOT / "tests" / "explain_cases" / "quickstart-budget-cut.yaml"
LOST_A100 = ROOT / "tests" / "explain_cases" / "quickstart-lost-a100.yaml"
LONGER_CONTEXT = ROOT / "tests" / "explain_cases" / "quickstart-longer-context.yaml"


@pytest.fixture(scope="module")
def builds(tmp_path_factory) -> dict[str, dict[str, str]]:
    """The artifacts of the specs, compiled once (the solver is the slow part)."""
    from hetcompile.backends.emit import artifacts

    # the session's builds of these specs (test_examples, test_explain build them too)
    return {"a": artifacts(build(QUICKSTART).ir), "b": artifacts(build(BUDGET_CUT).ir),
            "c": artifacts(build(LOST_A100).ir), "d": artifacts(build(LONGER_CONTEXT).ir)}


def _write(out: Path, files: dict[str, str]) -> None:
    """What `hetcompile build` writes, from precompiled artifacts (and its stale-file cleanup)."""
    from hetcompile.backends.emit import stale

    for p in stale(out, files) if out.exists() else []:
        import shutil

        shutil.rmtree(p) if p.is_dir() else p.unlink()
    for rel, text in files.items():
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        (out / rel).write_text(text)


def _deploy(tmp: Path, env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["hetcompile", "deploy", str(tmp / "out"), "--health-poll", "0.01", *args], env=env,
                          capture_output=True, text=True, cwd=tmp)


def _launches(tmp: Path, since: int = 0) -> list[str]:
    return [c[c.index("-c") + 1] for c in _calls(tmp)[since:] if c[:1] == ["launch"]]


def _converged(tmp: Path, out: Path) -> dict[str, str]:
    """Exactly the plan's clusters and the router run, each with the task OUT holds now."""
    rec = Record.load(out)
    plan = json.loads((out / "plan.json").read_text())
    assert sorted(rec.applied) == sorted(r["id"] for r in plan["replicas"])
    assert sorted(_clusters(tmp)) == sorted([*rec.applied.values(), f"{plan['plan']}-router"])
    for rid, c in rec.applied.items():
        assert (tmp / "sky-state" / "launched" / f"{c}.yaml").read_text() == (out / "sky" / f"{rid}.yaml").read_text()
        assert rec.clusters[c] == Launched(rid, task_hash(out, rid))
    routing = json.loads((out / "router" / "routing.json").read_text())
    assert sorted(r["id"] for r in routing["replicas"]) == sorted(rec.applied)
    assert all(r["endpoint"] for r in routing["replicas"])
    return rec.applied


def test_deploy_rebuild_converges(tmp_path: Path, builds) -> None:
    env = _env(tmp_path)
    out = tmp_path / "out"
    _write(out, builds["a"])
    p = _deploy(tmp_path, env)
    assert p.returncode == 0, p.stdout + p.stderr
    first = _converged(tmp_path, out)
    assert first == {f"r{i}": f"quickstart-r{i}" for i in range(4)}  # 3 A100 + 1 L4

    # the budget cut, rebuilt into the same folder: r2 (A100 -> L4) and r3 (L4 -> 2 L4, pp2) change shape
    _write(out, builds["b"])
    n0 = len(_calls(tmp_path))
    dry = _deploy(tmp_path, env, "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert "rolling" in dry.stdout
    for step in ("launch new r2", "tear down old r2", "launch new r3", "tear down old r3"):
        assert step in dry.stdout, dry.stdout
    assert _launches(tmp_path, n0) == [] and len(_calls(tmp_path)) == n0 + 1  # only `sky status`
    p = _deploy(tmp_path, env)
    assert p.returncode == 0, p.stdout + p.stderr
    second = _converged(tmp_path, out)
    # r2 and r3 are replaced by clusters of their own (each old one ran until it had to make room)
    assert second["r2"].startswith("quickstart-r2-") and second["r3"].startswith("quickstart-r3-")
    assert {k: second[k] for k in ("r0", "r1")} == {k: first[k] for k in ("r0", "r1")}
    assert _launches(tmp_path, n0) == [second["r2"], second["r3"]]
    acts = [(c[0], c[-1] if c[0] == "down" else c[1]) for c in _calls(tmp_path)[n0:] if c[0] in ("down", "exec", "launch")]
    assert ("down", "quickstart-r2") in acts and ("down", "quickstart-r3") in acts
    # in the planner's order, the one --dry-run printed: the money ceiling (the larger of the new $10/h
    # and the old plan's $/h) cannot hold old and new side by side, so the replacement rolls: old r3
    # (the least capacity) goes first, new r2 is launched and routed, then old r2 makes room for new r3
    planned = [line.split()[:2] + [line.split()[-1] if line.split()[1] == "down" else line.split()[5]]
               for line in dry.stdout.splitlines() if line.startswith("    sky ") and line.split()[1] in ("launch", "down")]
    done = [["sky", c[0], c[-1] if c[0] == "down" else c[c.index("-c") + 1]] for c in _calls(tmp_path)[n0:]
            if c[0] in ("launch", "down")]
    assert done == planned
    assert done == [["sky", "down", "quickstart-r3"], ["sky", "launch", second["r2"]],
                    ["sky", "down", "quickstart-r2"], ["sky", "launch", second["r3"]]]

    # a third run, after a compiler upgrade (only the scripts' "Generated by hetcompile V" header
    # differs): nothing to do, no launch, no down, as explain says of the engine flags
    from hetcompile import __version__

    for rel, text in builds["b"].items():
        if f"Generated by hetcompile {__version__}" in text:
            (out / rel).write_text(text.replace(f"Generated by hetcompile {__version__}", "Generated by hetcompile 99.0.0"))
    assert "hetcompile 99.0.0" in (out / "vllm" / "r0" / "node0.sh").read_text()
    n1 = len(_calls(tmp_path))
    p = _deploy(tmp_path, env)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "nothing to do" in p.stdout
    assert [c for c in _calls(tmp_path)[n1:] if c[0] in ("launch", "down", "exec")] == []

    # teardown: nothing of this folder's plan is left
    t = subprocess.run(["bash", str(out / "teardown.sh")], env=env, capture_output=True, text=True, cwd=tmp_path)
    assert t.returncode == 0, t.stderr
    assert _clusters(tmp_path) == {} and "teardown: all 5 cluster(s) of plan quickstart are down" in t.stdout


def _overlapping(tmp: Path) -> int:
    """The most `sky launch` calls the stub had in progress at one moment."""
    wins = [json.loads(x)[1:] for x in (tmp / "sky-state" / "launch_windows.jsonl").read_text().splitlines()]
    return max(sum(1 for a, b in wins if a <= t < b) for t, _ in wins)


@pytest.mark.parametrize("parallel", [8, 1])
def test_first_deploy_launches_in_parallel(tmp_path: Path, builds, parallel: int) -> None:
    """The first deploy's launches are next to each other in the plan (side by side, nothing runs
    yet): they run at the same time, up to --parallel; each still waited on for its health. The
    last line says where the router is."""
    env = _env(tmp_path)
    out = tmp_path / "out"
    _write(out, builds["a"])
    (tmp_path / "sky-state" / "launch_delay").write_text("0.5")
    p = _deploy(tmp_path, env, "--parallel", str(parallel))
    assert p.returncode == 0, p.stdout + p.stderr
    _converged(tmp_path, out)
    replicas = [c for c in _launches(tmp_path) if c != "quickstart-router"]
    assert len(replicas) == 4
    assert _overlapping(tmp_path) == (4 if parallel == 8 else 1)  # (the router launches after, alone)
    assert ("4 launches at once" in p.stdout) == (parallel == 8)
    last = p.stdout.strip().splitlines()[-1]
    assert last.startswith("router: http://") and last.endswith("/v1 (OpenAI-compatible)"), last


def _steps(text: str) -> list[str]:
    """The numbered step lines of a --dry-run."""
    return [line for line in text.splitlines() if line.startswith("[")]


def test_engine_args_change_restarts_in_place(tmp_path: Path, builds) -> None:
    """A rebuild that only raises max_model_len: explain, migrate --dry-run and deploy --dry-run show
    the same steps (one drain, restart, route per replica: no launch, no teardown), and deploy leaves
    every cluster running the new task (the stub's `sky exec`), on the same clusters, with the
    record's hashes following."""
    env = _env(tmp_path)
    out, old = tmp_path / "out", tmp_path / "old"
    _write(out, builds["a"])
    _write(old, builds["a"])
    assert _deploy(tmp_path, env).returncode == 0
    first = _converged(tmp_path, out)
    _write(out, builds["d"])
    new = tmp_path / "new"
    _write(new, builds["d"])

    ex = subprocess.run(["hetcompile", "explain", str(old), str(new), "--format", "json"], env=env, capture_output=True,
                        text=True, cwd=tmp_path)
    assert ex.returncode == 0, ex.stderr
    diff = json.loads(ex.stdout)
    mig = diff["migration"]
    assert mig["mode"] == "in-place"
    assert [p["changes"] for p in diff["changed"]] == [[{"field": "engine", "old": "--max-model-len 8192",
                                                          "new": "--max-model-len 16384"}]] * 4
    assert [s["action"] for s in mig["steps"]] == ["drain", "restart", "route"] * 4
    migrate = subprocess.run(["hetcompile", "migrate", str(old), str(new), "--dry-run"], env=env, capture_output=True,
                             text=True, cwd=tmp_path)
    assert migrate.returncode == 0, migrate.stderr
    n0 = len(_calls(tmp_path))
    dry = _deploy(tmp_path, env, "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert "in-place" in dry.stdout
    assert _steps(dry.stdout) == _steps(migrate.stdout) == [f"[{s['index']}] {s['text']}" for s in mig["steps"]]
    assert "sky cancel -y -a quickstart-r0" in dry.stdout and "sky exec quickstart-r0 sky/r0.yaml -d" in dry.stdout

    p = _deploy(tmp_path, env)
    assert p.returncode == 0, p.stdout + p.stderr
    assert _converged(tmp_path, out) == first  # the same clusters, now running the new tasks
    calls = [c for c in _calls(tmp_path)[n0:] if c[0] in ("launch", "down", "cancel")]
    assert calls == [["cancel", "-y", "-a", f"quickstart-r{i}"] for i in range(4)]
    for i in range(4):
        assert "--max-model-len 16384" in (tmp_path / "sky-state" / "launched" / f"quickstart-r{i}.yaml").read_text()
    assert not (tmp_path / "sky-state" / "cancelled").read_text().strip()


def test_rebuild_without_a_replica_removes_it(tmp_path: Path, builds) -> None:
    """A rebuild whose plan no longer has a replica (the lost-A100 plan, then quickstart's, into the
    same folder): its sky task and vLLM scripts leave OUT, and deploy tears its cluster down."""
    env = _env(tmp_path)
    out = tmp_path / "out"
    _write(out, builds["c"])
    assert _deploy(tmp_path, env).returncode == 0
    ids = {k: {r["id"] for r in json.loads(v["plan.json"])["replicas"]} for k, v in builds.items()}
    gone = sorted(ids["c"] - ids["a"])
    assert gone, ids  # the scenario needs a replica that leaves
    _write(out, builds["a"])
    for rid in gone:
        assert not (out / "sky" / f"{rid}.yaml").exists() and not (out / "vllm" / rid).exists()
    dry = _deploy(tmp_path, env, "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert all(f"tear down old {rid}" in dry.stdout for rid in gone), dry.stdout
    n0 = len(_calls(tmp_path))
    p = _deploy(tmp_path, env)
    assert p.returncode == 0, p.stdout + p.stderr
    _converged(tmp_path, out)
    downs = [c[-1] for c in _calls(tmp_path)[n0:] if c[0] == "down"]
    assert all(f"quickstart-{rid}" in downs and f"quickstart-{rid}" not in _clusters(tmp_path) for rid in gone)


def test_killed_between_steps_converges(tmp_path: Path, builds) -> None:
    env = _env(tmp_path)
    out = tmp_path / "out"
    _write(out, builds["a"])
    assert _deploy(tmp_path, env).returncode == 0
    _write(out, builds["b"])
    # deploy dies (SIGKILL) right after `sky launch` of the new r2 returned: nothing after it ran
    name = "quickstart-r2-" + task_hash(out, "r2")[:6]
    (tmp_path / "sky-state" / "kill_after").write_text(name + "\n")
    p = _deploy(tmp_path, env)
    assert p.returncode == -9
    assert name in _clusters(tmp_path) and Record.load(out).clusters[name].replica == "r2"  # recorded before it died
    (tmp_path / "sky-state" / "kill_after").write_text("")
    n0 = len(_calls(tmp_path))
    p = _deploy(tmp_path, env)
    assert p.returncode == 0, p.stdout + p.stderr
    # the launched r2 is kept, not launched twice; only new r3 (whose old cluster was down before the
    # kill, so its name is free again) is still to launch
    assert [c for c in _launches(tmp_path, n0) if c.startswith("quickstart-r2")] == []
    assert len(_launches(tmp_path, n0)) == 1 and _launches(tmp_path, n0)[0].startswith("quickstart-r3")
    # old r2 is gone; old r3 went before the kill (its name now runs new r3's task: _converged)
    assert _converged(tmp_path, out)["r2"] == name and "quickstart-r2" not in _clusters(tmp_path)


def test_failure_midway_then_rerun_converges(tmp_path: Path, builds) -> None:
    env = _env(tmp_path)
    out = tmp_path / "out"
    _write(out, builds["a"])
    assert _deploy(tmp_path, env).returncode == 0
    _write(out, builds["b"])
    (tmp_path / "sky-state" / "fail_down").write_text("quickstart-r2\n")
    p = _deploy(tmp_path, env)
    assert p.returncode == 1
    assert "deploy FAILED at step" in p.stdout and "`sky down -y quickstart-r2` failed" in p.stdout
    assert "re-run `hetcompile deploy" in p.stdout
    (tmp_path / "sky-state" / "fail_down").write_text("")
    p = _deploy(tmp_path, env)
    assert p.returncode == 0, p.stdout + p.stderr
    _converged(tmp_path, out)


def test_stray_clusters_are_torn_down_and_teardown_covers_the_record(tmp_path: Path, builds) -> None:
    """A cluster the record holds for this plan but no replica uses (a build that never converged),
    and one a pre-record deploy.sh left under this plan's name: deploy downs both, after routing."""
    env = _env(tmp_path)
    out = tmp_path / "out"
    _write(out, builds["a"])
    assert _deploy(tmp_path, env).returncode == 0
    rec = Record.load(out)
    rec.clusters["quickstart-r9"] = Launched("r9", "0" * 16)
    rec.save(out)
    state = tmp_path / "sky-state" / "clusters.json"
    state.write_text(json.dumps({**_clusters(tmp_path), "quickstart-r9": "UP", "quickstart-r7": "UP", "other-r1": "UP"}))
    (out / "sky" / "router.yaml").write_text((out / "sky" / "router.yaml").read_text() + "# moved\n")
    p = _deploy(tmp_path, env)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "note: the router's task (sky/router.yaml) changed; quickstart-router keeps running" in p.stdout
    assert "note: 2 cluster(s) of this plan serve no replica of it: quickstart-r7, quickstart-r9" in p.stdout
    assert "quickstart-r7" not in _clusters(tmp_path) and "quickstart-r9" not in _clusters(tmp_path)
    assert "other-r1" in _clusters(tmp_path)  # another plan's cluster is never touched
    state.write_text(json.dumps({**_clusters(tmp_path), "quickstart-r8": "UP"}))
    rec = Record.load(out)
    rec.clusters["quickstart-r8"] = Launched("r8", "1" * 16)
    rec.save(out)
    t = subprocess.run(["hetcompile", "teardown", str(out)], env=env, capture_output=True, text=True, cwd=tmp_path)
    assert t.returncode == 0, t.stderr
    assert _clusters(tmp_path) == {"other-r1": "UP"}


def test_other_plan_in_the_folder_is_refused(tmp_path: Path, builds) -> None:
    env = _env(tmp_path)
    out = tmp_path / "out"
    _write(out, builds["a"])
    assert _deploy(tmp_path, env).returncode == 0
    rec = Record.load(out)
    rec.plan = "yesterday"
    rec.save(out)
    p = _deploy(tmp_path, env)
    assert p.returncode == 1 and "was deployed as plan yesterday; this build is plan quickstart" in p.stderr
    assert "Traceback" not in p.stderr


SOLO = """name: solo
models:
  - {name: llama-3.1-8b, weights: meta-llama/Llama-3.1-8B-Instruct, dtype: DTYPE}
workloads:
  - {name: chat, model: llama-3.1-8b, input_tokens: 763, output_tokens: 232}
regions:
  - name: us-central1
    cloud: gcp
    offers:
      - {gpu: A100, gpus_per_node: 1, max_nodes: 1, price: $3.67/h}
network:
  intra_region: {bandwidth: 10Gbps, latency: 1ms}
  inter_region: {bandwidth: 1Gbps, latency: 30ms}
budget: $4/h
objective: max-throughput
solver: {time_limit: 30s}
"""


def test_capacity_gap_is_refused_unless_allowed(tmp_path: Path) -> None:
    """One A100 serves chat and only one can be had: a dtype change restarts it in place (a second
    copy does not fit), which leaves chat with nothing while it reloads. Refused (naming chat, the
    steps and how long), then run when allowed, on the same cluster."""
    env = _env(tmp_path)
    out = tmp_path / "out"
    spec = tmp_path / "solo.yaml"
    spec.write_text(SOLO.replace("DTYPE", "auto"))
    write(compile_spec(spec).ir, out)
    assert _deploy(tmp_path, env).returncode == 0
    spec.write_text(SOLO.replace("DTYPE", "fp16"))
    write(compile_spec(spec).ir, out)
    n0 = len(_calls(tmp_path))
    p = _deploy(tmp_path, env, "--health-timeout", "15min")
    assert p.returncode == 3, p.stdout + p.stderr
    assert "deploy: refused: workload chat would have no capacity after steps 1-2" in p.stdout
    assert "while new r0 restart(s) in place and load: up to 1 x the health timeout (15min)" in p.stdout
    dry = subprocess.run(["hetcompile", "deploy", str(out), "--dry-run"], env=env, capture_output=True, text=True)
    assert "old r0 alone serves chat and a second copy does not fit the ceilings" in dry.stdout
    assert [c for c in _calls(tmp_path)[n0:] if c[0] in ("launch", "down", "exec", "cancel")] == []
    p = _deploy(tmp_path, env, "--allow-capacity-gap")
    assert p.returncode == 0, p.stdout + p.stderr
    assert _converged(tmp_path, out)["r0"] == "solo-r0"  # restarted in place: the same cluster


def test_deploy_after_migrate_keeps_what_runs(tmp_path: Path, builds) -> None:
    """`migrate OLD NEW` leaves NEW's deploy record naming the clusters that serve NEW (untouched and
    restarted ones on OLD's names, launched ones on NEW's): a later `deploy NEW` has nothing to do,
    instead of launching the plan again beside the clusters it did not know (over the budget)."""
    env = _env(tmp_path)
    old, new = tmp_path / "out", tmp_path / "new"
    _write(old, builds["a"])
    assert _deploy(tmp_path, env).returncode == 0
    _write(new, builds["d"])  # a longer context: every replica restarts in place, on OLD's clusters
    m = subprocess.run(["hetcompile", "migrate", str(old), str(new), "--drain", "0s"], env=env, capture_output=True,
                       text=True, cwd=tmp_path)
    assert m.returncode == 0, m.stdout + m.stderr
    rec = Record.load(new)
    assert rec.plan == "quickstart" and sorted(rec.applied) == ["r0", "r1", "r2", "r3"]
    assert rec.applied["r0"] == "quickstart-r0" and rec.clusters["quickstart-router"] == Launched("router")
    n0 = len(_calls(tmp_path))
    p = subprocess.run(["hetcompile", "deploy", str(new), "--health-poll", "0.01"], env=env, capture_output=True,
                       text=True, cwd=tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "nothing to do" in p.stdout
    assert [c for c in _calls(tmp_path)[n0:] if c[0] in ("launch", "down", "exec", "cancel")] == []


def test_deploy_after_migrate_to_a_renamed_plan_keeps_its_router(tmp_path: Path, builds) -> None:
    """`migrate OLD NEW` where NEW's plan has another name keeps OLD's router (clients keep their
    endpoint); a later `deploy NEW` uses the router NEW's record names instead of launching
    `<new name>-router` beside it."""
    from hetcompile.backends.emit import artifacts

    spec = tmp_path / "v2.yaml"
    spec.write_text(LONGER_CONTEXT.read_text().replace("name: quickstart\n", "name: quickstart-v2\n", 1))
    env = _env(tmp_path)
    old, new = tmp_path / "out", tmp_path / "new"
    _write(old, builds["a"])
    assert _deploy(tmp_path, env).returncode == 0
    _write(new, artifacts(build(spec).ir))
    m = subprocess.run(["hetcompile", "migrate", str(old), str(new), "--drain", "0s"], env=env, capture_output=True,
                       text=True, cwd=tmp_path)
    assert m.returncode == 0, m.stdout + m.stderr
    assert Record.load(new).clusters["quickstart-router"] == Launched("router")
    for secret in ("router.token", "vllm.key"):  # what the running fleet was given, kept with NEW
        assert (new / secret).read_text() == (old / secret).read_text()
        assert (new / secret).stat().st_mode & 0o777 == 0o600
    n0 = len(_calls(tmp_path))
    p = subprocess.run(["hetcompile", "deploy", str(new), "--health-poll", "0.01"], env=env, capture_output=True,
                       text=True, cwd=tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "nothing to do" in p.stdout, p.stdout
    assert [c for c in _calls(tmp_path)[n0:] if c[0] in ("launch", "down", "exec", "cancel")] == []
    assert "quickstart-v2-router" not in _clusters(tmp_path)


def test_the_record_is_typed_and_its_file_keeps_its_format(tmp_path: Path) -> None:
    """OUT/deploy/record.json reads into Launched entries and writes back byte for byte (a record
    written by an earlier version still loads); an entry that is not an object is a clear error."""
    from hetcompile.migrate.diff import RECORD

    text = ('{\n  "applied": {\n    "r0": "q-r0"\n  },\n  "clusters": {\n    "q-r0": {\n      "hash": "%s",\n'
            '      "replica": "r0"\n    },\n    "q-router": {\n      "replica": "router"\n    }\n  },\n'
            '  "plan": "q"\n}\n') % ("a" * 16)
    (tmp_path / RECORD).parent.mkdir(parents=True)
    (tmp_path / RECORD).write_text(text)
    rec = Record.load(tmp_path)
    assert rec.clusters == {"q-r0": Launched("r0", "a" * 16), "q-router": Launched("router")}
    assert rec.cluster_of("r0", "a" * 16) == "q-r0" and rec.cluster_of("r0", "b" * 16) is None
    rec.save(tmp_path)
    assert (tmp_path / RECORD).read_text() == text
    (tmp_path / RECORD).write_text('{"plan": "q", "clusters": {"q-r0": "r0"}}')
    with pytest.raises(DeployError, match="cannot read the deploy record"):
        Record.load(tmp_path)
