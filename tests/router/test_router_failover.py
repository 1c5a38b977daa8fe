"""Failures: refused and reset connections, 5xx, timeouts, broken streams, client disconnects,
killed backends under load, reloads under load, SIGHUP and the CLI."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
from collections import Counter
from pathlib import Path

import aiohttp
import openai
import pytest

from .fake_vllm import FakeVllm
from .util import klass, post, replica, running_router, table, wait_for, write_table

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
BODY = {"model": "tiny", "prompt": "hello", "max_tokens": 2}


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # nothing listens here once the socket is closed


async def fire(url: str, n: int, body: dict = BODY, concurrency: int = 50) -> list[tuple[int, str]]:
    sem = asyncio.Semaphore(concurrency)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as s:

        async def one():
            async with sem:
                status, _, h = await post(s, url + "/v1/completions", body)
                return status, h.get("X-Hetcompile-Replica", "")

        return await asyncio.gather(*(one() for _ in range(n)))


async def test_connection_refused_fails_over_and_ejects(tmp_path):
    async with FakeVllm("b") as b:
        t = table([replica("a", f"http://127.0.0.1:{closed_port()}"), replica("b", b.url)])
        async with running_router(write_table(tmp_path / "routing.json", t), health_interval=30.0) as r:
            res = await fire(r.url, 30, concurrency=1)
            assert Counter(res) == {(200, "b"): 30}
            assert not r.table.replicas["a"].healthy  # passive failures ejected it
            # ejected after fail_threshold (3) failures, counting the first active poll's
            assert 2 <= r.metrics.retries.get(("a",)) <= 3


async def test_5xx_is_retried_elsewhere_and_passed_through_when_all_fail(tmp_path):
    async with FakeVllm("a", fail_status=500) as a, FakeVllm("b") as b:
        t = table([replica("a", a.url), replica("b", b.url)])
        async with running_router(write_table(tmp_path / "routing.json", t), fail_threshold=1000) as r:
            res = await fire(r.url, 20, concurrency=1)
            assert Counter(res) == {(200, "b"): 20}
            b.b.fail_status = 503
            async with aiohttp.ClientSession() as s:
                status, body, _ = await post(s, r.url + "/v1/completions", BODY)
            # 3 attempts (max_retries=2), then the last answer as the replica gave it
            assert status in (500, 503) and body["error"]["message"] == "engine failed"


async def test_all_unreachable_gives_502_and_none_deployed_gives_503(tmp_path):
    t = table([replica("a", f"http://127.0.0.1:{closed_port()}"), replica("b", None)])
    path = write_table(tmp_path / "routing.json", t)
    async with running_router(path, fail_threshold=1) as r:
        async with aiohttp.ClientSession() as s:
            status, body, _ = await post(s, r.url + "/v1/completions", BODY)
            assert status == 502 and "connect" in body["error"]["message"]
            assert not r.table.replicas["a"].healthy
            write_table(path, table([replica("a", None), replica("b", None)]))
            r.reload_now()
            status, body, _ = await post(s, r.url + "/v1/completions", BODY)
            assert status == 503 and body["error"]["type"] == "ServiceUnavailableError"


async def test_panic_mode_routes_when_every_replica_is_ejected(tmp_path):
    async with FakeVllm("a") as a, FakeVllm("b") as b:
        t = table([replica("a", a.url), replica("b", b.url)])
        async with running_router(write_table(tmp_path / "routing.json", t), health_interval=30.0) as r:
            for st in r.table.replicas.values():  # e.g. a network blip failed every health check
                for _ in range(3):
                    st.observe_health(False, 3, 2)
            assert not any(st.routable for st in r.table.replicas.values())
            res = await fire(r.url, 10)
            assert Counter(res) == {(200, "a"): 5, (200, "b"): 5}


async def test_reset_before_first_byte_is_retried_for_plain_and_stream(tmp_path):
    async with FakeVllm("a", reset_on_request=True) as a, FakeVllm("b") as b:
        t = table([replica("a", a.url), replica("b", b.url)])
        async with running_router(write_table(tmp_path / "routing.json", t), fail_threshold=1000) as r:
            res = await fire(r.url, 10, concurrency=1)
            assert Counter(res) == {(200, "b"): 10}
            assert len(a.records) == 5  # every other request tried a first
            c = openai.AsyncOpenAI(base_url=r.url + "/v1", api_key="x", max_retries=0)
            for _ in range(2):
                stream = await c.completions.create(model="tiny", prompt="x", max_tokens=4, stream=True)
                assert len([ch async for ch in stream]) == 4
            await c.close()


async def test_read_timeout_retries_on_another_replica(tmp_path):
    async with FakeVllm("a", hang=True) as a, FakeVllm("b") as b:
        t = table([replica("a", a.url), replica("b", b.url)])
        async with running_router(write_table(tmp_path / "routing.json", t), read_timeout=0.3) as r:
            res = await fire(r.url, 4, concurrency=4)
            assert Counter(res) == {(200, "b"): 4}
            await wait_for(lambda: a.cancelled == 2)  # the router hung up on a: vLLM aborts those


async def test_stream_broken_after_first_byte_ends_with_error_event(tmp_path):
    async with FakeVllm("a", break_after=2) as a:
        async with running_router(write_table(tmp_path / "routing.json", table([replica("a", a.url)]))) as r:
            async with aiohttp.ClientSession() as s:
                body = {"model": "tiny", "prompt": "x", "max_tokens": 5, "stream": True}
                async with s.post(r.url + "/v1/completions", json=body) as resp:
                    assert resp.status == 200
                    raw = await asyncio.wait_for(resp.read(), 10)  # ends: no hang
            events = raw.split(b"\n\n")
            assert events[-1] == b""  # ends on an event boundary: no torn event
            payloads = [e[len(b"data: ") :] for e in events[:-1]]
            assert payloads[-1] == b"[DONE]"
            objs = [json.loads(p) for p in payloads[:-1]]  # every event is whole JSON
            assert [o["choices"][0]["text"] for o in objs[:2]] == [" w0", " w1"]
            assert objs[2]["error"]["code"] == 502 and "mid-stream" in objs[2]["error"]["message"]
            # the OpenAI client turns the error event into an exception, not a hang
            c = openai.AsyncOpenAI(base_url=r.url + "/v1", api_key="x", max_retries=0)
            stream = await c.completions.create(model="tiny", prompt="x", max_tokens=5, stream=True)
            got = []
            with pytest.raises(openai.APIError):
                async for ch in stream:
                    got.append(ch)
            assert len(got) == 2
            await c.close()
            assert r.metrics.errors.get(("stream_broken",)) == 2


async def test_stream_that_goes_silent_ends_with_error_event(tmp_path):
    gate: asyncio.Queue = asyncio.Queue()  # never fed: the replica stalls after its first chunk
    async with FakeVllm("a", gate=gate) as a:
        path = write_table(tmp_path / "routing.json", table([replica("a", a.url)]))
        async with running_router(path, read_timeout=0.3) as r:
            async with aiohttp.ClientSession() as s:
                body = {"model": "tiny", "prompt": "x", "max_tokens": 5, "stream": True}
                async with s.post(r.url + "/v1/completions", json=body) as resp:
                    raw = await asyncio.wait_for(resp.read(), 10)
            events = raw.split(b"\n\n")
            assert json.loads(events[0][6:])["choices"][0]["text"] == " w0"
            assert b"no data from the replica" in events[1] and events[2] == b"data: [DONE]"
            await wait_for(lambda: a.cancelled == 1)  # and the stalled request was abandoned upstream


async def test_client_disconnect_cancels_upstream(tmp_path):
    async with FakeVllm("a", chunk_delay=0.02, delay=0.0) as a:
        async with running_router(write_table(tmp_path / "routing.json", table([replica("a", a.url)]))) as r:
            ra = r.table.replicas["a"]
            async with aiohttp.ClientSession() as s:
                body = {"model": "tiny", "prompt": "x", "max_tokens": 1000, "stream": True}
                resp = await s.post(r.url + "/v1/completions", json=body)
                await resp.content.readany()
                resp.close()  # the client goes away mid-stream
            await wait_for(lambda: a.cancelled == 1)
            await wait_for(lambda: ra.inflight == 0)
            a.b.hang = True  # now a non-streamed request the client gives up on
            async with aiohttp.ClientSession() as s:
                with pytest.raises(asyncio.TimeoutError):
                    await post(s, r.url + "/v1/completions", BODY, timeout=aiohttp.ClientTimeout(total=0.3))
            await wait_for(lambda: a.cancelled == 2)
            await wait_for(lambda: ra.inflight == 0)
            assert r.metrics.errors.get(("client_disconnect",)) == 2


async def start_process_backend(name: str, delay: float) -> tuple[subprocess.Popen, int]:
    p = subprocess.Popen(
        [sys.executable, str(HERE / "fake_vllm.py"), "--name", name, "--delay", str(delay)],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    line = await asyncio.get_running_loop().run_in_executor(None, p.stdout.readline)
    assert line.startswith("PORT "), line
    return p, int(line.split()[1])


async def test_killing_a_backend_under_load_loses_no_request(tmp_path):
    procs = []
    try:
        pa, port_a = await start_process_backend("a", 0.02)
        procs.append(pa)
        pb, port_b = await start_process_backend("b", 0.02)
        procs.append(pb)
        t = table([replica("a", f"http://127.0.0.1:{port_a}"), replica("b", f"http://127.0.0.1:{port_b}")])
        async with running_router(write_table(tmp_path / "routing.json", t), health_interval=0.2) as r:
            task = asyncio.ensure_future(fire(r.url, 400, concurrency=40))
            await wait_for(lambda: r.metrics.requests.get(("tiny", "default", "200")) >= 80)
            pb.kill()  # SIGKILL under load: in-flight requests on b die with it
            res = await task
            assert [s for s, _ in res] == [200] * 400
            assert Counter(rep for _, rep in res)["a"] > 200
            assert r.metrics.retries.get(("b",)) >= 1  # some really were in flight on b
            assert r.table.replicas["b"].inflight == 0
    finally:
        for p in procs:
            p.kill()
            p.wait()
            p.stdout.close()


async def test_reload_under_load_drops_nothing(tmp_path):
    async with FakeVllm("a", delay=0.005) as a, FakeVllm("b", delay=0.005) as b, FakeVllm("c", delay=0.005) as c:
        tables = [
            table([replica("a", a.url), replica("b", b.url)], models={"tiny": [klass("d", {"a": 0.8, "b": 0.2})]}),
            table(
                [replica("a", a.url), replica("b", b.url), replica("c", c.url)],
                models={"tiny": [klass("d", {"b": 0.5, "c": 0.5})]},
                policy="least-outstanding",
            ),
            table([replica("c", c.url)], policy="kv-aware"),
        ]
        path = write_table(tmp_path / "routing.json", tables[0])
        async with running_router(path) as r:
            load = asyncio.ensure_future(fire(r.url, 600, concurrency=60))
            reloads = 0
            async with aiohttp.ClientSession() as s:
                while not load.done():
                    write_table(path, tables[reloads % 3])
                    async with s.post(r.url + "/admin/reload") as resp:
                        assert resp.status == 200
                    reloads += 1
                    await asyncio.sleep(0.005)
            res = await load
            assert reloads >= 5
            assert [s for s, _ in res] == [200] * 600
            assert {rep for _, rep in res} == {"a", "b", "c"}
            # a bad table is refused and the old one keeps serving
            path.write_text("{ not json")
            async with aiohttp.ClientSession() as s:
                async with s.post(r.url + "/admin/reload") as resp:
                    assert resp.status == 400
                assert (await post(s, r.url + "/v1/completions", BODY))[0] == 200
            assert r.metrics.reloads.get(("error",)) == 1
            for st in (a, b, c):
                assert st.inflight == 0


async def test_cli_sighup_reload_auth_and_sigterm(tmp_path):
    async with FakeVllm("a") as a, FakeVllm("b") as b:
        path = write_table(tmp_path / "routing.json", table([replica("a", a.url)]))
        port = closed_port()
        env = {**os.environ, "HC_ROUTER_TOKEN": "tok", "PYTHONPATH": str(ROOT)}
        p = subprocess.Popen(
            [sys.executable, "-m", "hetcompile.router", "--table", str(path), "--port", str(port),
             "--auth-token-env", "HC_ROUTER_TOKEN", "--health-interval", "0.05", "--log-level", "WARNING"],
            cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        try:
            line = await asyncio.get_running_loop().run_in_executor(None, p.stdout.readline)
            assert f"listening on http://127.0.0.1:{port}" in line
            url = f"http://127.0.0.1:{port}"
            auth = {"Authorization": "Bearer tok"}
            async with aiohttp.ClientSession() as s:
                assert (await post(s, url + "/v1/completions", BODY))[0] == 401
                assert (await post(s, url + "/v1/completions", BODY, headers=auth))[2]["X-Hetcompile-Replica"] == "a"
                write_table(path, table([replica("b", b.url)]))
                p.send_signal(signal.SIGHUP)

                async def status():
                    async with s.get(url + "/admin/status", headers=auth) as resp:
                        return await resp.json()

                for _ in range(200):
                    if "b" in (await status())["replicas"]:
                        break
                    await asyncio.sleep(0.02)
                assert (await post(s, url + "/v1/completions", BODY, headers=auth))[2]["X-Hetcompile-Replica"] == "b"
            p.send_signal(signal.SIGTERM)
            assert await asyncio.get_running_loop().run_in_executor(None, p.wait, 10) == 0
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
            p.stdout.close()


def test_cli_rejects_bad_table_cleanly(tmp_path):
    bad = tmp_path / "routing.json"
    bad.write_text("{}")
    out = subprocess.run(
        [sys.executable, "-m", "hetcompile.router", "--table", str(bad), "--port", str(closed_port())],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert out.returncode == 2
    assert "router error: invalid routing table" in out.stderr and "Traceback" not in out.stderr
