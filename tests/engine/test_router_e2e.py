"""End to end against the real engine: two `vllm serve` replicas started from the generated
scripts of the tiny example, the bundled router started from the generated routing table, and
the `openai` client talking through it (completions and chat, streaming and not). The router's
kv-aware policy polls vLLM's real /metrics; killing one replica moves traffic to the other.
Assertions are on token counts and finish reasons, never on text (dummy weights).

Replica auth on the same servers: given HC_VLLM_API_KEY, the generated script starts `vllm serve ...
--api-key`, which answers /health without a key (the router's and deploy.sh's probes) and /v1/* only
with the right bearer key; its /metrics gauges are what `hetcompile migrate` drains on, read from the
real server busy and idle (`_drain_gauges`; this was a test with a server of its own).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import openai
import pytest

from conftest import ROOT, build
from hetcompile.backends.emit import write
from hetcompile.migrate.run import in_flight
from hetcompile.testing import free_port, launch, make_tiny_model

pytestmark = pytest.mark.engine


def _json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=10) as resp:
        return json.load(resp)


@contextlib.contextmanager
def router_process(table: Path, port: int, log: Path, env: dict[str, str] | None = None):
    cmd = [sys.executable, "-m", "hetcompile.router", "--table", str(table), "--port", str(port),
           "--policy", "kv-aware", "--health-interval", "0.5"]
    with open(log, "ab") as fh:
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, cwd=ROOT, env={**os.environ, **(env or {})})
    try:
        deadline = time.monotonic() + 60  # startup guard, not a performance assertion
        while True:
            try:
                if _json(f"http://127.0.0.1:{port}/admin/status")["replicas"]:
                    break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"router did not start:\n{log.read_text()[-3000:]}")
            time.sleep(0.2)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _wait(pred, what: str, limit: float = 60.0) -> None:
    deadline = time.monotonic() + limit  # a guard against hanging, not a speed check
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.25)


def _status(url: str, key: str | None = None) -> int:
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {key}"} if key else {})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status
    except urllib.error.HTTPError as e:
        return e.code


def _drain_gauges(base: str, key: str, served: str) -> None:
    """The replica answers /v1/* only with the right key, and migrate's drain reads 0 in flight when it
    is idle and the running requests while they run."""
    assert _status(f"{base}/health") == 200
    assert _status(f"{base}/v1/models") == 401
    assert _status(f"{base}/v1/models", "wrong") == 401
    assert _status(f"{base}/v1/models", key) == 200
    auth = {"Authorization": f"Bearer {key}"}
    assert in_flight(f"{base}/metrics", auth) == 0.0
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


def _observe_while_sending(out: Path, base: str, client, served: str, ids: list[str]) -> None:
    """`hetcompile observe` (observe_out) over 10 s of real metrics while a sender thread sends 3
    requests/s through the router (fewer when the machine is busy: the sender waits for each answer): the
    observed count is what the sender saw answered between the router's first and last scrape (within 10%
    or 2 requests), and every replica's vLLM histograms were read."""
    from hetcompile.observe.run import dumps_observed, observe_out, read_observed

    done: list[float] = []
    stop = threading.Event()

    def send() -> None:
        t = time.monotonic()
        while not stop.is_set():
            client.completions.create(model=served, prompt=[9, 10, 11], max_tokens=4, extra_body={"ignore_eos": True})
            done.append(time.monotonic())
            t += 1 / 3
            stop.wait(max(0.0, t - time.monotonic()))

    ticks: list[float] = []

    def clock() -> float:
        ticks.append(time.monotonic())
        return ticks[-1]

    sender = threading.Thread(target=send, daemon=True)
    sender.start()
    try:
        time.sleep(1.0)
        doc = observe_out(out, 10.0, 1.0, base, clock=clock)
    finally:
        stop.set()
        sender.join(timeout=60)
    (out / "observed.yaml").write_text(dumps_observed(doc))
    assert dumps_observed(read_observed(out / "observed.yaml")) == dumps_observed(doc)  # a round trip through the file
    first, last = ticks[0], ticks[-(len(ids) + 1)]  # the router is scraped first in every round
    sent = sum(1 for t in done if first <= t <= last)
    observed = sum(w.requests for w in doc.workloads)
    slack = max(2, 0.1 * sent)  # a request in flight at a scrape may land on either side of it
    assert sent >= 5 and abs(observed - sent) <= slack, (observed, sent, doc.missing)
    rate = sum(w.rate_per_s or 0.0 for w in doc.workloads)
    assert rate == pytest.approx(sent / (last - first), abs=slack / (last - first))
    for r in doc.replicas:
        assert r.scrapes >= 2 and r.input_tokens is not None and r.itl_s is not None, r
    assert not [m for m in doc.missing if m.split(":")[0] in ids + ["router"] and "correction" not in m], doc.missing


def test_router_in_front_of_two_real_replicas(tmp_path: Path) -> None:
    out = tmp_path / "out"
    write(build(ROOT / "examples/tiny-cpu/spec.yaml").ir, out)
    plan = json.loads((out / "plan.json").read_text())
    ids = [r["id"] for r in plan["replicas"]]
    assert len(ids) == 2 and all(r["pp"] == 1 for r in plan["replicas"])
    served = plan["replicas"][0]["served_name"]
    model = make_tiny_model(tmp_path / "tiny")
    key = {"HC_VLLM_API_KEY": "test-replica-key"}  # as the SkyPilot secret delivers it

    with contextlib.ExitStack() as stack:
        bases = {}
        replica_ctx = {}
        for rid in ids:
            # each port picked just before its launch: a running vLLM binds ephemeral ports of its own,
            # so a port picked before the first replica started can be taken by the time the second starts
            ctx = launch(out / "vllm" / rid / "node0.sh", port=free_port(), model=model, env=key, log=tmp_path / f"{rid}.log")
            bases[rid] = stack.enter_context(ctx)
            replica_ctx[rid] = ctx
        table = out / "router" / "routing.json"
        subprocess.run(
            [sys.executable, "-m", "hetcompile.cli", "fill-endpoints", str(table), *(f"{r}={bases[r]}" for r in ids), "--in-place"],
            check=True, cwd=ROOT,
        )
        # the replicas' OpenAI routes need the key; /health (and so the launcher's probe) does not
        for rid in ids:
            assert _status(f"{bases[rid]}/v1/models") == 401
        _drain_gauges(bases[ids[0]], key["HC_VLLM_API_KEY"], served)
        rport = free_port()
        base = stack.enter_context(router_process(table, rport, tmp_path / "router.log", env=key))
        status = lambda: _json(f"{base}/admin/status")["replicas"]  # noqa: E731
        _wait(lambda: all(r["healthy"] and r["observed_kv_usage"] is not None for r in status().values()),
              "the router to poll both replicas' /health and vLLM /metrics")

        client = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0, timeout=120)
        assert [m.id for m in client.models.list().data] == [served]

        c = client.completions.create(model=served, prompt=[5, 6, 7], max_tokens=4, temperature=0,
                                      extra_body={"ignore_eos": True})
        assert c.usage.completion_tokens == 4 and c.choices[0].finish_reason == "length"

        chunks = list(client.completions.create(model=served, prompt=[5, 6, 7], max_tokens=6, temperature=0, stream=True,
                                                stream_options={"include_usage": True}, extra_body={"ignore_eos": True}))
        assert chunks[-1].usage.completion_tokens == 6
        assert [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1] == "length"
        # streamed, not one buffered blob. Not one chunk per token: a busy vLLM merges the tokens it
        # produced since its last write into one chunk (3 chunks for 6 tokens in a CI run beside the
        # other test worker)
        assert len([ch for ch in chunks if ch.choices]) >= 2

        chat = client.chat.completions.create(model=served, messages=[{"role": "user", "content": "hello world"}],
                                              max_tokens=5, temperature=0, extra_body={"ignore_eos": True})
        assert chat.usage.completion_tokens == 5 and chat.choices[0].finish_reason == "length"

        stream = list(client.chat.completions.create(model=served, messages=[{"role": "user", "content": "hi"}],
                                                     max_tokens=5, temperature=0, stream=True,
                                                     stream_options={"include_usage": True}, extra_body={"ignore_eos": True}))
        assert stream[0].choices[0].delta.role == "assistant"
        assert stream[-1].usage.completion_tokens == 5

        # both replicas took traffic under the plan's weights
        for _ in range(8):
            client.completions.create(model=served, prompt=[9, 10], max_tokens=2, extra_body={"ignore_eos": True})
        metrics = urllib.request.urlopen(f"{base}/metrics", timeout=10).read().decode()
        chosen = {rid: sum(float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines()
                           if line.startswith("hetcompile_router_policy_choices_total") and f'replica="{rid}"' in line)
                  for rid in ids}
        assert all(v > 0 for v in chosen.values()), chosen

        _observe_while_sending(out, base, client, served, ids)

        # kill one replica: the router ejects it and every request still succeeds on the other
        dead, alive = ids[0], ids[1]
        replica_ctx[dead].__exit__(None, None, None)
        for _ in range(6):
            r = client.completions.create(model=served, prompt=[5, 6], max_tokens=3, extra_body={"ignore_eos": True})
            assert r.usage.completion_tokens == 3
        _wait(lambda: not status()[dead]["healthy"], "the router to eject the dead replica")
        before = _json(f"{base}/admin/status")
        for _ in range(4):
            client.completions.create(model=served, prompt=[5, 6], max_tokens=2, extra_body={"ignore_eos": True})
        metrics = urllib.request.urlopen(f"{base}/metrics", timeout=10).read().decode()
        assert before["replicas"][alive]["healthy"]
        assert 'hetcompile_router_requests_total' in metrics
