"""Measured profiles in the spec: fitted coefficients drive the estimate; empty entries are errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import ROOT
from hetcompile.ir.document import plan_doc
from hetcompile.driver import compile_spec
from hetcompile.errors import SpecError
from hetcompile.perf.capacity import chain_capacity

TINY = (ROOT / "examples" / "tiny-cpu" / "spec.yaml").read_text()
COEFF = {"step_s": 0.005, "per_token_s": 2e-5, "per_kv_token_s": 1e-8, "request_s": 0.008}


def _spec(tmp_path: Path, profiles: str, extra: str = "") -> Path:
    (tmp_path / "profiles.yaml").write_text(profiles)
    spec = tmp_path / "spec.yaml"
    spec.write_text(TINY + "profiles: [profiles.yaml]\n" + extra)
    return spec


def test_profile_without_numbers_is_an_error_with_a_span(tmp_path: Path) -> None:
    spec = _spec(tmp_path, "- {model: tiny-llama, gpu: L4, tp: 1}\n")
    with pytest.raises(SpecError) as exc:
        compile_spec(spec)
    text = str(exc.value)
    assert "profile tiny-llama/L4/tp1/pp1 has no measured numbers" in text
    assert "profiles.yaml:1" in text and "hetcompile profile ENDPOINT" in text


def test_inline_profile_without_numbers_is_an_error(tmp_path: Path) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text(TINY + "profiles:\n  - {model: tiny-llama, gpu: L4}\n")
    with pytest.raises(SpecError, match="has no measured numbers") as exc:
        compile_spec(spec)
    assert "spec.yaml:" in str(exc.value)


def test_fitted_coefficients_replace_the_step_model(tmp_path: Path) -> None:
    lines = "\n".join(f"    {k}: {v}" for k, v in COEFF.items())
    # the queueing bound off: what is pinned is the fitted model's capacity at the max_utilization headroom
    spec = _spec(tmp_path, f"- model: tiny-llama\n  gpu: L4\n  tp: 1\n  coefficients:\n{lines}\n",
                 "max_ttft_slowdown: null\n")
    ir = compile_spec(spec).ir
    shapes = {s.pp: s for s in ir.shapes}
    est = shapes[1].estimate
    assert est.source == "measured"
    rm = est.step_model
    assert rm is not None and rm.source == "fitted" and rm.step_overhead_s == pytest.approx(COEFF["step_s"])
    assert rm.request_overhead_s == pytest.approx(COEFF["request_s"])
    # one engine step of n tokens reading S context tokens costs o + c n + k S
    n, S = 10.0, 1000.0
    assert sum(rm.stage_times(n, S, 0.0)) == pytest.approx(COEFF["step_s"] + COEFF["per_token_s"] * n + COEFF["per_kv_token_s"] * S, rel=1e-4)
    bare = rm.model_copy(update={"request_overhead_s": 0.0})
    for w in ir.workloads:
        e = chain_capacity(rm, w.input_tokens, w.output_tokens)
        assert dict(est.full_rps)[w.name] == pytest.approx(e.requests_per_s, rel=1e-4)
        # the plan keeps the headroom below the fitted full-load capacity
        assert dict(est.throughput_rps)[w.name] == pytest.approx(ir.max_utilization * e.requests_per_s, rel=1e-4)
        # the fitted per-request overhead r is charged once, before the first token
        assert dict(est.ttft_s)[w.name] == pytest.approx(chain_capacity(bare, w.input_tokens, w.output_tokens).ttft_s + COEFF["request_s"], rel=1e-4)
    assert shapes[2].estimate.source == "analytic"
    # the plan document carries the estimate's source and step model for a profiled replica
    for r in plan_doc(ir).replicas:
        assert r.estimate_source == ("measured" if r.pp == 1 else "analytic")
        assert r.step_model is not None and r.step_model.source == ("fitted" if r.pp == 1 else "analytic")


def test_fitted_coefficients_are_slo_capped(tmp_path: Path) -> None:
    """A measured profile does not bypass the SLO: a TPOT target below the fitted step time at one
    sequence excludes the shape for that workload; a loose one caps it below the unconstrained fit."""
    lines = "\n".join(f"    {k}: {v}" for k, v in COEFF.items())
    prof = f"- model: tiny-llama\n  gpu: L4\n  tp: 1\n  throughput: {{short: 5000/s}}\n  coefficients:\n{lines}\n"
    tight = TINY.replace("share: 80%}", "share: 80%, slo: {tpot: 4ms}}")
    (tmp_path / "profiles.yaml").write_text(prof)
    spec = tmp_path / "spec.yaml"
    spec.write_text(tight + "profiles: [profiles.yaml]\n")
    fitted = next(s for s in compile_spec(spec, stop_after="profile").ir.shapes if s.pp == 1 and s.id.endswith("slo:short"))
    rps = dict(fitted.estimate.throughput_rps)
    assert rps["short"] == 0.0  # 5 ms step > 4 ms target: the measured 5000/s does not win
    assert dict(fitted.estimate.binding)["short"].startswith("slo-unmeetable")
    loose = TINY.replace("share: 80%}", "share: 80%, slo: {tpot: 50ms}}")
    spec.write_text(loose + "profiles: [profiles.yaml]\n")
    fitted = next(s for s in compile_spec(spec, stop_after="profile").ir.shapes if s.pp == 1 and s.id.endswith("slo:short"))
    capped = dict(fitted.estimate.throughput_rps)["short"]
    assert 0.0 < capped < 5000.0
    assert dict(fitted.estimate.tpot_s)["short"] <= 0.050


def test_measured_throughput_still_wins_over_the_fit(tmp_path: Path) -> None:
    lines = "\n".join(f"    {k}: {v}" for k, v in COEFF.items())
    spec = _spec(tmp_path, f"- model: tiny-llama\n  gpu: L4\n  throughput: {{short: 50/s}}\n  coefficients:\n{lines}\n",
                 "max_ttft_slowdown: null\n")  # the headroom and bindings without the queueing bound
    shapes = {s.pp: s for s in compile_spec(spec).ir.shapes}
    est = shapes[1].estimate
    assert est.source == "measured" and est.step_model.source == "fitted"
    assert dict(est.full_rps)["short"] == pytest.approx(50.0)
    assert dict(est.throughput_rps)["short"] == pytest.approx(0.85 * 50.0)  # planned with the default headroom
    assert dict(est.binding) == {"short": "measured", "long": "max-num-seqs"}
    assert shapes[2].estimate.source == "analytic" and shapes[2].estimate.step_model.source == "analytic"


def test_profile_command_reports_an_unreachable_server(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from hetcompile.cli import app
    from hetcompile.testing import free_port

    res = CliRunner().invoke(app, ["profile", f"http://127.0.0.1:{free_port()}", "--model", "m", "--gpu", "L4",
                                   "-o", str(tmp_path / "p.yaml")])
    assert res.exit_code == 1
    assert "cannot list models at" in res.output and "is a vLLM OpenAI server" in res.output
    assert not (tmp_path / "p.yaml").exists()
    res = CliRunner().invoke(app, ["profile", "http://x", "--model", "m", "--gpu", "L4", "--prompts", "16,abc"])
    assert res.exit_code == 1 and "--prompts: expected comma-separated integers" in res.output


def test_profile_api_key_and_unauthorized(tmp_path: Path, monkeypatch) -> None:
    """A server started with --api-key (as deploy starts replicas) answers 401 without it: the error
    says unauthorized and how to pass the key; with --api-key-env the key is sent as a Bearer token."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from typer.testing import CliRunner

    from hetcompile.cli import app

    seen: list[str | None] = []

    class H(BaseHTTPRequestHandler):
        def _answer(self) -> None:
            seen.append(self.headers.get("Authorization"))
            if self.headers.get("Authorization") != "Bearer s3cret":
                self.send_response(401)
                self.end_headers()
                self.wfile.write(b'{"error": "Unauthorized"}')
                return
            body = b'{"data": [{"id": "tiny"}]}' if self.path == "/v1/models" else b"engine stopped"
            self.send_response(200 if self.path == "/v1/models" else 500)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = _answer  # noqa: N815

        def log_message(self, *a) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_port}"
    args = ["profile", url, "--model", "m", "--gpu", "L4", "-o", str(tmp_path / "p.yaml")]
    try:
        res = CliRunner().invoke(app, args)
        assert res.exit_code == 1
        assert "/v1/models answered 401: unauthorized" in res.output and "--api-key-env" in res.output
        assert "lists no model" not in res.output
        res = CliRunner().invoke(app, [*args, "--api-key-env", "HC_TEST_KEY"])
        assert res.exit_code == 1 and "HC_TEST_KEY is not set in the environment" in res.output
        monkeypatch.setenv("HC_TEST_KEY", "s3cret")
        res = CliRunner().invoke(app, [*args, "--api-key-env", "HC_TEST_KEY"])
        assert res.exit_code == 1 and "/v1/completions answered 500: engine stopped" in res.output  # past the key
        assert seen[-1] == "Bearer s3cret" and "s3cret" not in res.output
    finally:
        server.shutdown()
    assert not (tmp_path / "p.yaml").exists()


def test_a_profile_may_name_the_model_by_its_served_name(tmp_path: Path) -> None:
    """`hetcompile profile --model` given the name the server answers to (what /v1/models lists): the
    spec that includes the file loads it for the model that serves under that name."""
    from hetcompile.ir.lower import load_problem

    lines = "\n".join(f"    {k}: {v}" for k, v in COEFF.items())
    spec = _spec(tmp_path, f"- model: tiny\n  gpu: L4\n  tp: 1\n  coefficients:\n{lines}\n")  # tiny-cpu serves as 'tiny'
    ir, _, _ = load_problem(spec)
    assert [m.model for m in ir.measured] == ["tiny-llama"]
    spec.write_text(spec.read_text().replace("served_name: tiny\n", "served_name: other\n"))
    with pytest.raises(SpecError, match="profile for unknown model 'tiny'"):
        load_problem(spec)
