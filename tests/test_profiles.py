"""Measured profiles in the spec: fitted coefficients drive the estimate; empty entries are errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import ROOT
from hetcompile.backends.plan_json import plan_doc
from hetcompile.driver import compile_spec
from hetcompile.ir.errors import SpecError
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
    spec = _spec(tmp_path, f"- model: tiny-llama\n  gpu: L4\n  tp: 1\n  coefficients:\n{lines}\n")
    doc = plan_doc(compile_spec(spec).ir)
    assert doc.replicas
    for r in doc.replicas:
        assert r.estimate_source == "measured"
        rm = r.step_model
        assert rm is not None and rm.source == "fitted" and rm.step_overhead_s == pytest.approx(COEFF["step_s"])
        # one engine step of n tokens reading S context tokens costs o + c n + k S
        n, S = 10.0, 1000.0
        assert sum(rm.stage_times(n, S, 0.0)) == pytest.approx(COEFF["step_s"] + COEFF["per_token_s"] * n + COEFF["per_kv_token_s"] * S, rel=1e-4)
        for w in doc.workloads:
            est = chain_capacity(rm, w.input_tokens, w.output_tokens)
            got = r.workloads[w.name]
            assert got.capacity_requests_per_s == pytest.approx(est.requests_per_s, rel=1e-4)
            assert got.ttft_s == pytest.approx(est.ttft_s + COEFF["request_s"], rel=1e-4)


def test_measured_throughput_still_wins_over_the_fit(tmp_path: Path) -> None:
    lines = "\n".join(f"    {k}: {v}" for k, v in COEFF.items())
    spec = _spec(tmp_path, f"- model: tiny-llama\n  gpu: L4\n  throughput: {{short: 50/s}}\n  coefficients:\n{lines}\n")
    shapes = {s.pp: s for s in compile_spec(spec).ir.shapes}
    est = shapes[1].estimate
    assert est.source == "measured" and est.step_model.source == "fitted"
    assert dict(est.throughput_rps)["short"] == pytest.approx(50.0)
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
