"""Smoke tests of the engine harness: the engine venv is there, the tiny model is deterministic, a
contract-shaped launch script passes the flag table, and a script whose `vllm serve` dies is
reported with its exit code and log. A real server from a generated script answering requests is
tests/engine/test_profile_simulate.py's first check (one vLLM start serves both). Fails, not skips,
when the venv from scripts/vllm_cpu_venv.sh is missing.
"""

from __future__ import annotations

import json
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


def test_launch_reports_a_dead_script(tmp_path: Path) -> None:
    script = tmp_path / "bad.sh"
    script.write_text(SAMPLE_SCRIPT.replace("--dtype bfloat16", "--dtype fp7"))
    with pytest.raises(RuntimeError, match=r"exited with code 2(.|\n)*invalid choice: 'fp7'"):
        with launch(script, port=free_port(), model=tmp_path / "none", log=tmp_path / "bad.log"):
            pass  # pragma: no cover
