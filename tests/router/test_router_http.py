"""The router's HTTP surface with real servers and clients on 127.0.0.1: OpenAI API, streaming,
auth, limits, errors, metrics."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import openai
import pytest

from .fake_vllm import FakeVllm
from .util import klass, post, replica, running_router, table, write_table


def oai(router, key: str = "unused") -> openai.AsyncOpenAI:
    # max_retries=0: failover is the router's job, the client must not hide it
    return openai.AsyncOpenAI(base_url=router.url + "/v1", api_key=key, max_retries=0, timeout=20)


async def test_openai_client_completions_chat_models(tmp_path):
    async with FakeVllm("a") as a, FakeVllm("b", model="big") as b:
        t = table(
            [replica("a", a.url), replica("b", b.url, model="big")],
            models={"tiny": [klass("d", {"a": 1.0})], "big": [klass("d", {"b": 1.0})]},
        )
        async with running_router(write_table(tmp_path / "routing.json", t)) as r:
            c = oai(r)
            comp = await c.completions.create(model="tiny", prompt="hello", max_tokens=4)
            assert comp.usage.completion_tokens == 4 and comp.choices[0].finish_reason == "length"
            chat = await c.chat.completions.create(model="big", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
            assert chat.choices[0].message.content == " w0 w1"
            assert sorted(m.id for m in (await c.models.list()).data) == ["big", "tiny"]
            assert len(a.records) == 1 and len(b.records) == 1
            with pytest.raises(openai.NotFoundError):
                await c.completions.create(model="nope", prompt="x", max_tokens=1)
            await c.close()


async def test_body_and_trace_headers_forwarded_unchanged(tmp_path, monkeypatch):
    monkeypatch.setenv("HC_BACKEND_KEY", "backend-secret")
    async with FakeVllm("a") as a:
        t = table([replica("a", a.url, api_key_env="HC_BACKEND_KEY")])
        async with running_router(write_table(tmp_path / "routing.json", t), auth_token="client-secret") as r:
            raw = b'{ "model":"tiny",  "prompt": "caf\\u00e9 \xe2\x98\x95", "max_tokens": 2, "vendor_field": [1, {"x": null}] }'
            async with aiohttp.ClientSession() as s:
                status, body, headers = await post(
                    s, r.url + "/v1/completions?trace=1", raw,
                    headers={"Authorization": "Bearer client-secret", "X-Request-Id": "req-42"},
                )  # fmt: skip
            assert status == 200 and headers["X-Hetcompile-Replica"] == "a"
            rec = a.records[0]
            assert rec.body == raw  # byte for byte, never re-serialized
            assert rec.path == "/v1/completions?trace=1"
            assert rec.headers["X-Request-Id"] == "req-42"
            # the client's token is for the router; the backend gets its own from api_key_env
            assert rec.headers["Authorization"] == "Bearer backend-secret"


async def test_streaming_is_passed_through_chunk_by_chunk(tmp_path):
    gate: asyncio.Queue = asyncio.Queue()
    async with FakeVllm("a", gate=gate) as a:
        async with running_router(write_table(tmp_path / "routing.json", table([replica("a", a.url)]))) as r:
            async with aiohttp.ClientSession() as s:
                body = {"model": "tiny", "prompt": "hi", "max_tokens": 5, "stream": True}
                async with s.post(r.url + "/v1/completions", json=body) as resp:
                    assert resp.status == 200
                    assert resp.headers["Content-Type"].startswith("text/event-stream")
                    events, buf = [], b""
                    while True:
                        # the backend sends chunk k+1 only after we received chunk k: a router
                        # that buffered would deadlock here (the wait_for makes that a failure)
                        chunk = await asyncio.wait_for(resp.content.readany(), 5)
                        if not chunk:
                            break
                        buf += chunk
                        while b"\n\n" in buf:
                            ev, buf = buf.split(b"\n\n", 1)
                            events.append(ev)
                            gate.put_nowait(1)
            assert events[-1] == b"data: [DONE]"
            texts = [json.loads(e[6:])["choices"][0]["text"] for e in events[:-1]]
            assert texts == [" w0", " w1", " w2", " w3", " w4"]


async def test_openai_streaming_completions_and_chat(tmp_path):
    async with FakeVllm("a", chunk_delay=0.002) as a:
        async with running_router(write_table(tmp_path / "routing.json", table([replica("a", a.url)]))) as r:
            c = oai(r)
            stream = await c.completions.create(model="tiny", prompt="hi", max_tokens=6, stream=True)
            chunks = [ch async for ch in stream]
            assert len(chunks) == 6 and chunks[-1].choices[0].finish_reason == "length"
            stream = await c.chat.completions.create(
                model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=3, stream=True
            )
            chunks = [ch async for ch in stream]
            assert chunks[0].choices[0].delta.role == "assistant"
            assert "".join(ch.choices[0].delta.content or "" for ch in chunks) == " w0 w1 w2"
            await c.close()


async def test_auth_token(tmp_path):
    async with FakeVllm("a") as a:
        async with running_router(write_table(tmp_path / "routing.json", table([replica("a", a.url)])), auth_token="tok") as r:
            body = {"model": "tiny", "prompt": "x", "max_tokens": 1}
            async with aiohttp.ClientSession() as s:
                assert (await post(s, r.url + "/v1/completions", body))[0] == 401
                assert (await post(s, r.url + "/v1/completions", body, headers={"Authorization": "Bearer nope"}))[0] == 401
                assert (await post(s, r.url + "/v1/completions", body, headers={"Authorization": "Bearer tok"}))[0] == 200
                async with s.get(r.url + "/v1/models") as resp:
                    assert resp.status == 401
                async with s.post(r.url + "/admin/reload") as resp:
                    assert resp.status == 401
                for path in ("/health", "/metrics"):  # probes and scrapers need no token
                    async with s.get(r.url + path) as resp:
                        assert resp.status == 200
            assert len(a.records) == 1
            c = oai(r, key="tok")
            assert (await c.completions.create(model="tiny", prompt="x", max_tokens=1)).usage.completion_tokens == 1
            await c.close()


async def test_limits_and_client_errors(tmp_path):
    async with FakeVllm("a") as a:
        async with running_router(write_table(tmp_path / "routing.json", table([replica("a", a.url)])), max_body_bytes=4096) as r:
            async with aiohttp.ClientSession() as s:
                status, body, _ = await post(s, r.url + "/v1/completions", {"model": "tiny", "prompt": "x" * 5000})
                assert status == 413 and body["error"]["code"] == 413
                status, body, _ = await post(s, r.url + "/v1/completions", b"{not json")
                assert status == 400 and body["error"]["type"] == "invalid_request_error"
                status, body, _ = await post(s, r.url + "/v1/completions", {"model": "gpt-9", "prompt": "x"})
                assert status == 404 and "tiny" in body["error"]["message"]
                # a single-model table routes a request that names no model
                status, body, _ = await post(s, r.url + "/v1/completions", {"prompt": "x", "max_tokens": 1})
                assert status == 200
            assert len(a.records) == 1  # none of the bad requests reached the backend


async def test_backend_4xx_is_passed_through_not_retried(tmp_path):
    async with FakeVllm("a", fail_status=400) as a, FakeVllm("b", fail_status=400) as b:
        t = table([replica("a", a.url), replica("b", b.url)])
        async with running_router(write_table(tmp_path / "routing.json", t)) as r:
            async with aiohttp.ClientSession() as s:
                status, body, _ = await post(s, r.url + "/v1/completions", {"model": "tiny", "prompt": "x"})
            assert status == 400 and body["error"]["message"] == "engine failed"
            assert len(a.records) + len(b.records) == 1


async def test_health_and_metrics_endpoints(tmp_path):
    async with FakeVllm("a") as a:
        t = table([replica("a", a.url), replica("b", None)])
        async with running_router(write_table(tmp_path / "routing.json", t)) as r:
            async with aiohttp.ClientSession() as s:
                for _ in range(3):
                    assert (await post(s, r.url + "/v1/completions", {"model": "tiny", "prompt": "x"}))[0] == 200
                async with s.get(r.url + "/health") as resp:
                    h = await resp.json()
                assert h == {"status": "ok", "plan": "test", "replicas": 2, "routable": 1}
                async with s.get(r.url + "/metrics") as resp:
                    assert resp.headers["Content-Type"].startswith("text/plain")
                    text = await resp.text()
            assert 'hetcompile_router_requests_total{model="tiny",class="default",code="200"} 3' in text
            assert 'hetcompile_router_policy_choices_total{policy="weighted",replica="a"} 3' in text
            assert 'hetcompile_router_request_duration_seconds_count{model="tiny"} 3' in text
            assert 'hetcompile_router_inflight_requests{replica="a"} 0' in text
            assert 'hetcompile_router_replica_routable{replica="b"} 0' in text
            assert "# TYPE hetcompile_router_upstream_first_byte_seconds histogram" in text


async def test_a_thousand_concurrent_requests(tmp_path):
    # more at once than the backends' listen backlog (128): the pool ramps connections up
    async with FakeVllm("a", delay=0.2, chunk_delay=0.01) as a, FakeVllm("b", delay=0.2, chunk_delay=0.01) as b:
        t = table([replica("a", a.url), replica("b", b.url)])
        async with running_router(write_table(tmp_path / "routing.json", t)) as r:
            async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as s:

                async def one(i: int):
                    body = {"model": "tiny", "prompt": "x", "max_tokens": 4, "stream": i % 2 == 0}
                    async with s.post(r.url + "/v1/completions", json=body) as resp:
                        return resp.status, (await resp.read()).count(b"data: ")

                res = await asyncio.gather(*(one(i) for i in range(1000)))
            assert sorted(set(res)) == [(200, 0), (200, 5)] and len(res) == 1000
            assert a.completed + b.completed == 1000
            assert r.metrics.errors.values == {}
