"""The profiler's HTTP client survives a keep-alive connection that the server closes as it is reused
(uvicorn drops idle connections after 5 s): a request disconnected before any response is sent once
more; one disconnected again, or mid-stream, is an error."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest
from aiohttp import web

from hetcompile.profiling.sweep import SweepConfig, client_session, one_request


async def _serve(drops: int):
    seen = {"n": 0}

    async def completions(request: web.Request) -> web.StreamResponse:
        seen["n"] += 1
        if seen["n"] <= drops:
            request.transport.close()  # gone before any response byte, as a closed keep-alive socket
            return web.Response()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for i in range(3):
            await resp.write(f"data: {json.dumps({'choices': [{'text': str(i)}]})}\n\n".encode())
        await resp.write(f"data: {json.dumps({'choices': [], 'usage': {'completion_tokens': 3}})}\n\n".encode())
        await resp.write(b"data: [DONE]\n\n")
        return resp

    app = web.Application()
    app.router.add_post("/v1/completions", completions)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    return runner, f"http://127.0.0.1:{port}", seen


def _one(drops: int):
    async def go():
        runner, base, seen = await _serve(drops)
        try:
            async with client_session(30.0) as session:
                return await one_request(session, base, "m", 4, 1, SweepConfig(output_tokens=3)), seen["n"]
        finally:
            await runner.cleanup()

    return asyncio.run(go())


def test_a_request_dropped_before_its_response_is_sent_again() -> None:
    sample, sent = _one(drops=1)
    assert sent == 2 and sample.completion_tokens == 3


def test_dropped_twice_is_an_error() -> None:
    with pytest.raises(aiohttp.ServerDisconnectedError):
        _one(drops=2)
