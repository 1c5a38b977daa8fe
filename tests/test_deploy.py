"""deploy.sh / teardown.sh (wrappers of `hetcompile deploy` / `teardown`; the standalone scripts of a
mixed-GPU plan) against a recording stub `sky`, and shell injection through every user string of
the spec (served name, weights, model, region, workload, GPU names). test_deploy_reconcile.py has
deploy as a reconciler: rebuilds, re-runs, kills, capacity gaps."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import HEALTH, ROOT
from hetcompile.backends.emit import write
from hetcompile.backends.shell import comment, quote
from hetcompile.driver import compile_spec
from hetcompile.testing.stub_sky import install

EVIL = "x$(touch PWNED)`touch PWNED2`'\"\n;touch PWNED3 #"


def _env(tmp: Path) -> dict[str, str]:
    bin_dir = tmp / "bin"
    install(bin_dir, tmp / "sky-state")
    (tmp / "sky-state" / "endpoint_default").write_text(HEALTH[0])
    wheel = tmp / "hetcompile-0.0.0-py3-none-any.whl"
    wheel.write_bytes(b"stub wheel")
    env = dict(os.environ)
    env["PATH"] = f"{bin_dir}{os.pathsep}{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"
    env["HETCOMPILE_SRC"] = str(wheel)
    env["HF_TOKEN"] = "hf_stub"
    for k in ("HC_VLLM_API_KEY", "HC_ROUTER_TOKEN"):
        env.pop(k, None)
    return env


def _build(tmp: Path, example: str = "three-regions", text: str | None = None) -> Path:
    spec = tmp / "spec.yaml"
    spec.write_text(text if text is not None else (ROOT / "examples" / example / "spec.yaml").read_text())
    res = compile_spec(spec, verify=False)  # deploy runs what the plan names; verification is tested elsewhere
    out = tmp / "out"
    write(res.ir, out)
    return out


def _calls(tmp: Path) -> list[list[str]]:
    return [json.loads(x) for x in (tmp / "sky-state" / "calls.jsonl").read_text().splitlines()]


def _clusters(tmp: Path) -> dict[str, str]:
    return json.loads((tmp / "sky-state" / "clusters.json").read_text())


def test_quote_helpers() -> None:
    assert quote("a b") == "'a b'"
    assert subprocess.run(["bash", "-c", f"printf %s {quote(EVIL)}"], capture_output=True, text=True).stdout == EVIL
    assert "\n" not in comment(EVIL)


def test_deploy_happy_path(tmp_path: Path) -> None:
    out = _build(tmp_path)
    env = _env(tmp_path)
    p = subprocess.run(["bash", str(out / "deploy.sh")], env=env, capture_output=True, text=True, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert "launch: launched, healthy" in p.stdout and "deploy: done" in p.stdout
    ups = _clusters(tmp_path)
    assert "three-regions-router" in ups and len(ups) >= 2
    assert (out / "router" / "dist" / "hetcompile-0.0.0-py3-none-any.whl").exists()
    routing = json.loads((out / "router" / "routing.json").read_text())
    assert all(r["endpoint"].startswith("http://127.0.0.1:") for r in routing["replicas"])


def test_deploy_preflight_fails_before_any_launch(tmp_path: Path) -> None:
    out = _build(tmp_path)
    env = _env(tmp_path)
    env["HETCOMPILE_SRC"] = "no/such/checkout"
    p = subprocess.run(["bash", str(out / "deploy.sh")], env=env, capture_output=True, text=True, cwd=tmp_path)
    assert p.returncode == 2
    assert "HETCOMPILE_SRC=no/such/checkout does not exist" in p.stderr
    assert not (tmp_path / "sky-state" / "calls.jsonl").exists()  # sky was never called


def test_deploy_launch_failure_summarizes_and_exits_nonzero(tmp_path: Path) -> None:
    out = _build(tmp_path)
    env = _env(tmp_path)
    clusters = [c for c in (json.loads((out / "plan.json").read_text()).get("replicas") or [])]
    names = sorted(f"three-regions-{r['id']}" for r in clusters)
    assert len(names) >= 2
    (tmp_path / "sky-state" / "fail_launch").write_text(names[-1] + "\n")
    p = subprocess.run(["bash", str(out / "deploy.sh")], env=env, capture_output=True, text=True, cwd=tmp_path)
    assert p.returncode == 1
    assert f"deploy FAILED at step {len(names)} (launch): `sky launch -y -d -c {names[-1]} " in p.stdout
    assert "running (billing): " + ", ".join(names[:-1]) + f"; and {names[-1]} may be partly up" in p.stdout
    assert f"re-run `hetcompile deploy {out}`" in p.stdout
    assert sorted(_clusters(tmp_path)) == names[:-1]  # router never launched
    # what may bill is in the record, the failed launch too (recorded before `sky launch` ran: it may
    # be partly up): teardown and the next deploy find it
    assert sorted(json.loads((out / "deploy" / "record.json").read_text())["clusters"]) == names
    assert not any(c[:1] == ["launch"] and "three-regions-router" in c for c in _calls(tmp_path))


def test_teardown_fails_loud(tmp_path: Path) -> None:
    out = _build(tmp_path)
    env = _env(tmp_path)
    assert subprocess.run(["bash", str(out / "deploy.sh")], env=env, capture_output=True, cwd=tmp_path).returncode == 0
    (tmp_path / "sky-state" / "fail_down").write_text("three-regions-router\n")
    p = subprocess.run(["bash", str(out / "teardown.sh")], env=env, capture_output=True, text=True, cwd=tmp_path)
    assert p.returncode == 1
    assert "teardown FAILED for 1 cluster(s)" in p.stderr and "three-regions-router (sky down -y three-regions-router)" in p.stderr
    assert list(_clusters(tmp_path)) == ["three-regions-router"]  # every other down still ran
    (tmp_path / "sky-state" / "fail_down").write_text("")
    p = subprocess.run(["bash", str(out / "teardown.sh")], env=env, capture_output=True, text=True, cwd=tmp_path)
    assert p.returncode == 0 and _clusters(tmp_path) == {}


def _evil_spec() -> str:
    import yaml

    spec = yaml.safe_load((ROOT / "examples" / "tiny-cpu" / "spec.yaml").read_text())
    m = spec["models"][0]
    # free text that reaches scripts; names (model, workload, region, plan) are identifiers that
    # the loader refuses unless they match names.py (tests/test_hostile.py)
    m["served_name"] = "tiny" + EVIL
    m["weights"] = "./tiny" + EVIL
    return yaml.safe_dump(spec)


def test_injection_through_names_is_refused_at_the_spec(tmp_path: Path) -> None:
    import yaml

    from hetcompile.errors import SpecError

    for edit in ("model", "workload", "region"):
        spec = yaml.safe_load((ROOT / "examples" / "tiny-cpu" / "spec.yaml").read_text())
        if edit == "model":
            spec["models"][0]["name"] += EVIL
        elif edit == "workload":
            spec["workloads"][0]["name"] += EVIL
        else:
            spec["regions"][0]["name"] += EVIL
        (tmp_path / "spec.yaml").write_text(yaml.safe_dump(spec))
        with pytest.raises(SpecError, match="is not allowed"):
            compile_spec(tmp_path / "spec.yaml")


def test_injection_every_user_string(tmp_path: Path) -> None:
    out = _build(tmp_path, text=_evil_spec())
    scripts = sorted(out.rglob("*.sh"))
    assert len(scripts) >= 4
    for s in scripts:
        p = subprocess.run(["bash", "-n", str(s)], capture_output=True, text=True)
        assert p.returncode == 0, (s, p.stderr)
    # run every node script with a stub `vllm` that prints its argv: the strings arrive intact
    env = _env(tmp_path)
    (tmp_path / "bin" / "vllm").write_text('#!/bin/sh\nfor a in "$@"; do printf "%s\\0" "$a"; done\n')
    (tmp_path / "bin" / "vllm").chmod(0o755)
    env["HC_MASTER_ADDR"] = "127.0.0.1"
    env["HC_VLLM_API_KEY"] = EVIL
    for s in sorted((out / "vllm").rglob("*.sh")):
        p = subprocess.run(["bash", str(s)], env=env, capture_output=True, text=True, cwd=tmp_path)
        assert p.returncode == 0, p.stderr
        argv = p.stdout.split("\0")
        assert argv[1] == "./tiny" + EVIL
        assert argv[argv.index("--served-model-name") + 1] == "tiny" + EVIL
        assert argv[argv.index("--api-key") + 1] == EVIL  # the key is one word, never shell text
    env.pop("HC_VLLM_API_KEY")
    p = subprocess.run(["bash", str(out / "deploy.sh")], env=env, capture_output=True, text=True, cwd=tmp_path)
    p2 = subprocess.run(["bash", str(out / "teardown.sh")], env=env, capture_output=True, text=True, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert p2.returncode == 0, p2.stderr
    assert not list(tmp_path.rglob("PWNED*")) and not list(ROOT.glob("PWNED*"))


def test_mixed_job_group_deploy_and_teardown(tmp_path: Path) -> None:
    from test_place_pass import write_spec

    res = compile_spec(write_spec(tmp_path), verify=False)
    out = tmp_path / "out"
    write(res.ir, out)
    plan = json.loads((out / "plan.json").read_text())
    mixed = [r["id"] for r in plan["replicas"] if r["mixed"]]
    assert mixed
    env = _env(tmp_path)
    for rid in mixed:
        env[f"HC_ENDPOINT_{rid.upper()}"] = "http://10.0.0.9:8000"
    p = subprocess.run(["bash", str(out / "deploy.sh")], env=env, capture_output=True, text=True, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    jobs = [c for c in _calls(tmp_path) if c[:2] == ["jobs", "launch"]]
    assert sorted(c[-1] for c in jobs) == sorted(f"sky/{rid}.yaml" for rid in mixed)
    p = subprocess.run(["bash", str(out / "teardown.sh")], env=env, capture_output=True, text=True, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    cancels = [c for c in _calls(tmp_path) if c[:2] == ["jobs", "cancel"]]
    assert len(cancels) == len(mixed)


def test_rerun_skips_clusters_already_up(tmp_path: Path) -> None:
    out = _build(tmp_path)
    env = _env(tmp_path)
    names = sorted(f"three-regions-{r['id']}" for r in json.loads((out / "plan.json").read_text())["replicas"])
    (tmp_path / "sky-state" / "fail_launch").write_text(names[-1] + "\n")
    assert subprocess.run(["bash", str(out / "deploy.sh")], env=env, capture_output=True, cwd=tmp_path).returncode == 1
    (tmp_path / "sky-state" / "fail_launch").write_text("")
    n0 = len(_calls(tmp_path))
    p = subprocess.run(["bash", str(out / "deploy.sh")], env=env, capture_output=True, text=True, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    launched = [c[c.index("-c") + 1] for c in _calls(tmp_path)[n0:] if c[:1] == ["launch"]]
    assert launched == [names[-1], "three-regions-router"]  # the ones already UP were not relaunched
    assert p.stdout.count("done in an earlier run, skipped") == len(names) - 1


def test_router_gets_a_generated_token_as_a_managed_secret(tmp_path: Path) -> None:
    import yaml

    out = _build(tmp_path)
    task = yaml.safe_load((out / "sky" / "router.yaml").read_text())
    assert task["secrets"] == {"HC_ROUTER_TOKEN": None, "HC_VLLM_API_KEY": None}
    assert "--auth-token-env HC_ROUTER_TOKEN" in task["run"]
    env = _env(tmp_path)
    env.pop("HC_ROUTER_TOKEN", None)
    assert subprocess.run(["bash", str(out / "deploy.sh")], env=env, capture_output=True, cwd=tmp_path).returncode == 0
    token = (out / "router.token").read_text().strip()
    assert len(token) >= 40 and (out / "router.token").stat().st_mode & 0o077 == 0
    router = [c for c in _calls(tmp_path) if c[:1] == ["launch"] and "three-regions-router" in c]
    assert router and router[0][-4:] == ["--secret", "HC_ROUTER_TOKEN", "--secret", "HC_VLLM_API_KEY"]
    assert token not in " ".join(router[0])


def test_replicas_require_a_generated_api_key(tmp_path: Path) -> None:
    """Every replica task takes HC_VLLM_API_KEY as a managed secret and refuses to start without
    it; deploy.sh generates it once (mode 600), passes it by name only, and the routing table
    tells the router to send it upstream."""
    import yaml

    out = _build(tmp_path)
    for f in sorted((out / "sky").glob("r[0-9]*.yaml")):
        for task in yaml.safe_load_all(f.read_text()):
            if "run" not in task:
                continue  # a job group's header
            assert task["secrets"] == {"HF_TOKEN": None, "HC_VLLM_API_KEY": None}
            # the task's run stops before vLLM starts when the secret did not arrive
            p = subprocess.run(["bash", "-c", task["run"]], env={"PATH": os.environ["PATH"], "HOME": str(tmp_path)},
                               capture_output=True, text=True)
            assert p.returncode != 0 and "HC_VLLM_API_KEY is not set" in p.stderr
    routing = json.loads((out / "router" / "routing.json").read_text())
    assert {r["api_key_env"] for r in routing["replicas"]} == {"HC_VLLM_API_KEY"}
    env = _env(tmp_path)
    p = subprocess.run(["bash", str(out / "deploy.sh")], env=env, capture_output=True, text=True, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    key = (out / "vllm.key").read_text().strip()
    assert len(key) >= 40 and (out / "vllm.key").stat().st_mode & 0o077 == 0
    launches = [c for c in _calls(tmp_path) if c[:1] == ["launch"]]
    assert launches and all("HC_VLLM_API_KEY" in [c[i + 1] for i, a in enumerate(c) if a == "--secret"] for c in launches)
    assert all(key not in " ".join(c) for c in _calls(tmp_path))
    # a re-run keeps the same key (running replicas hold it)
    subprocess.run(["bash", str(out / "deploy.sh")], env=env, capture_output=True, cwd=tmp_path, check=True)
    assert (out / "vllm.key").read_text().strip() == key


def test_deploy_refuses_to_start_without_hf_token(tmp_path: Path) -> None:
    out = _build(tmp_path)
    env = _env(tmp_path)
    env.pop("HF_TOKEN")
    p = subprocess.run(["bash", str(out / "deploy.sh")], env=env, capture_output=True, text=True, cwd=tmp_path)
    assert p.returncode == 2 and "set HF_TOKEN" in p.stderr
    assert not (tmp_path / "sky-state" / "calls.jsonl").exists()


def test_head_node_passes_api_key_to_vllm(tmp_path: Path) -> None:
    """The head's `vllm serve` gets `--api-key` (a vLLM 0.33 flag) from HC_VLLM_API_KEY; without the
    variable a local run serves /v1 open and says so on stderr (the SkyPilot task refuses instead)."""
    from hetcompile.backends.vllm_flags import check_serve_argv

    assert check_serve_argv(["m", "--api-key", "k"]) == []  # in the pinned 0.33.0 flag table
    out = _build(tmp_path, "tiny-cpu")
    env = _env(tmp_path)
    (tmp_path / "bin" / "vllm").write_text('#!/bin/sh\nfor a in "$@"; do printf "%s\\0" "$a"; done\n')
    (tmp_path / "bin" / "vllm").chmod(0o755)
    script = str(out / "vllm" / "r0" / "node0.sh")
    env["HC_VLLM_API_KEY"] = "k3y with space"
    p = subprocess.run(["bash", script], env=env, capture_output=True, text=True)
    argv = p.stdout.split("\0")
    assert p.returncode == 0 and argv[argv.index("--api-key") + 1] == "k3y with space"
    env.pop("HC_VLLM_API_KEY")
    p = subprocess.run(["bash", script], env=env, capture_output=True, text=True)
    assert p.returncode == 0 and "--api-key" not in p.stdout.split("\0")
    assert "HC_VLLM_API_KEY is not set: vLLM serves /v1 WITHOUT auth" in p.stderr


def test_deploy_sky_check_preflight_names_the_cloud(tmp_path: Path) -> None:
    """A cloud the plan uses without credentials stops deploy.sh before any launch, naming it."""
    out = _build(tmp_path)  # three-regions: gcp and aws
    clouds = sorted({n["cloud"] for n in json.loads((out / "plan.json").read_text())["nodes"]})
    assert len(clouds) >= 2
    env = _env(tmp_path)
    (tmp_path / "sky-state" / "fail_check").write_text(clouds[-1] + "\n")
    p = subprocess.run(["bash", str(out / "deploy.sh")], env=env, capture_output=True, text=True, cwd=tmp_path)
    assert p.returncode == 2
    assert f"deploy: no usable credentials for: {clouds[-1]} (`sky check {clouds[-1]}` says why); nothing was launched" in p.stderr
    calls = _calls(tmp_path)
    assert calls == [["check", *clouds]]  # checked every cloud of the plan, launched nothing


def test_deploy_waits_for_health_and_names_the_replica(tmp_path: Path) -> None:
    """Endpoints are filled only once every replica answers /health; a timeout names the replica,
    its cluster and `sky logs CLUSTER`, and the router is not launched."""
    out = _build(tmp_path)
    env = _env(tmp_path)
    names = sorted(f"three-regions-{r['id']}" for r in json.loads((out / "plan.json").read_text())["replicas"])
    # one replica's endpoint answers nothing: a port nobody listens on
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]
    (tmp_path / "sky-state" / "endpoints.json").write_text(json.dumps({names[-1]: f"127.0.0.1:{dead}"}))
    args = ["--health-timeout", "1s", "--health-poll", "0.2"]
    p = subprocess.run(["bash", str(out / "deploy.sh"), *args], env=env, capture_output=True, text=True, cwd=tmp_path)
    assert p.returncode == 1
    assert f"{names[-1]} not healthy after 1s (GET http://127.0.0.1:{dead}/health); its logs: sky logs {names[-1]}" in p.stdout
    assert p.stdout.count("launch: launched, healthy") == len(names) - 1
    assert not any(c[:1] == ["launch"] and "three-regions-router" in c for c in _calls(tmp_path))
    assert all(r["endpoint"] is None for r in json.loads((out / "router" / "routing.json").read_text())["replicas"])
    # fixed: the re-run relaunches nothing, finds every replica healthy, fills the table, starts the router
    (tmp_path / "sky-state" / "endpoints.json").write_text("{}")
    p = subprocess.run(["bash", str(out / "deploy.sh"), *args], env=env, capture_output=True, text=True, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert p.stdout.count("done in an earlier run, skipped") == len(names) - 1
    assert p.stdout.count("already UP, not relaunched, healthy") == 1  # launched, never healthy: waited for again
    assert not [c for c in _calls(tmp_path) if c[:1] == ["launch"] and names[-1] in c][1:]
