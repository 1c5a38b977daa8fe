"""Price provenance and what clouds sell (issue 20, item 3).

Every offer's price says where it came from (the spec, a `gpus:` entry, or the catalog default with
the date it was checked); a default price is a located warning; a GPU a cloud does not sell and a
region a cloud does not have are spec errors (goldens: tests/golden/errors/gpu_not_sold,
region_unknown, region_typo).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from conftest import ROOT
from hetcompile.errors import SpecError
from hetcompile.ir.lower import load_problem
from hetcompile.perf import clouds

SPEC = """name: default-price
models:
  - name: llama-3-8b
    max_model_len: 4096
workloads:
  - {name: chat, model: llama-3-8b, input_tokens: 500, output_tokens: 100, rate: 1/s}
regions:
  - name: us-central1
    cloud: gcp
    offers:
      - {gpu: L4, max_nodes: 2}
      - {gpu: A100, max_nodes: 1, price: $3.67/h}
budget: $5/h
"""


def test_default_price_is_a_located_warning_and_says_its_source(tmp_path) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC)
    ir, _, _ = load_problem(spec)
    sources = {o.gpu: o.price_source for o in ir.offers}
    assert sources["A100"] == "spec"
    assert sources["L4"].startswith("catalog default (") and "checked 2026-11-22" in sources["L4"]
    assert len(ir.warnings) == 1
    assert ir.warnings[0].startswith(f"{spec}:11:9: no price for L4 in us-central1 (gcp)")
    assert "$0.81/h per GPU" in ir.warnings[0]


def test_build_prints_the_warning_and_plan_carries_prices(tmp_path) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC)
    proc = subprocess.run([sys.executable, "-m", "hetcompile.cli", "build", str(spec), "-q", "-o", str(tmp_path / "out")],
                          cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "warning: " in proc.stderr and "spec.yaml:11:9: no price for L4" in proc.stderr
    plan = json.loads((tmp_path / "out" / "plan.json").read_text())
    by_offer = {p["offer"]: p for p in plan["prices"]}
    assert by_offer["us-central1/A100x1"]["source"] == "spec"
    assert by_offer["us-central1/L4x1"]["source"].startswith("catalog default")
    assert plan["warnings"] and plan["warnings"][0].startswith("spec.yaml:11:9: ")  # no build-machine path
    md = (tmp_path / "out" / "plan.md").read_text()
    assert "## Prices" in md and "catalog default (" in md and "Warnings:" in md


def test_all_owned_offer_needs_no_price_warning(tmp_path) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC.replace("{gpu: L4, max_nodes: 2}", "{gpu: L4, max_nodes: 2, owned: 2}"))
    ir, _, _ = load_problem(spec)
    assert ir.warnings == ()


@pytest.mark.parametrize("cloud, region, gpu, ok", [
    ("gcp", "us-central1", "L4", True), ("gcp", "us-central1", "A10G", False), ("aws", "us-east-1", "A10G", True),
    ("lambda", "us-east-1", "A6000", True),  # Lambda spells it A6000, SkyPilot's sky_name is RTXA6000
    ("kubernetes", "anything", "A10G", True), ("runpod", "US", "L40S", True), ("vast", "x", "A100-80GB", True), ("gcp", "us-east1", "L40S", False),
])
def test_cloud_table(cloud: str, region: str, gpu: str, ok: bool) -> None:
    from hetcompile.perf import catalog

    assert clouds.check_region(cloud, region) is None
    assert (clouds.check_gpu(cloud, gpu, catalog.gpu_spellings(gpu)) is None) == ok


def test_unknown_region_is_a_spec_error(tmp_path) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC.replace("cloud: gcp", "cloud: aws").replace("      - {gpu: A100, max_nodes: 1, price: $3.67/h}\n", ""))
    with pytest.raises(SpecError) as info:
        load_problem(spec)
    assert "aws has no region 'us-central1'" in str(info.value) and "spec.yaml:8:11:" in str(info.value)
