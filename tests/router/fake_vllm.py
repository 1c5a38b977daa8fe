"""A fake vLLM server for router tests: the OpenAI, /health and /metrics surfaces of `vllm serve`.

Shapes follow vLLM 0.32/0.33 (shared/reference/vllm_cpu.md): completions and chat completions,
plain and SSE (`data: {...}\\n\\n` chunks, `data: [DONE]`), `/health` 200 with an empty body,
`/metrics` with the `vllm:*` gauges and labels `{engine="0",model_name=...}`, errors as
`{"error": {...}}`. Behaviour is mutable at run time through `FakeVllm.b` (a `Behavior`):
slow, failing, hanging, dying, breaking streams, gated streams, reported KV usage.

P/D disaggregation (`kv_role`, hetcompile/router/disagg.py): a "prefill" fake checks what vLLM's
NIXL prefill needs (kv_transfer_params with do_remote_decode, stream false, max_tokens 1, no
stream_options or min_tokens; 400 otherwise) and answers with top-level kv_transfer_params as
NixlConnectorScheduler.request_finished makes them, keeping them in the group's `kv_store`; a
"decode" fake accepts only params a prefill put there, each once (a second read of the same KV
is an error, as reading freed blocks would be), and counts requests that came without params.

In-process: `async with FakeVllm("a") as f: f.url`. As a process (for kill -9 tests):
`python tests/router/fake_vllm.py --name a [--delay S]` prints `PORT <n>` once listening.
Always binds 127.0.0.1.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from dataclasses import dataclass

from aiohttp import web
from multidict import CIMultiDict


@dataclass
class Behavior:
    delay: float = 0.0  # seconds before the answer (non-streamed) or before the first chunk
    chunk_delay: float = 0.0  # seconds between streamed chunks
    tokens: int = 3  # completion tokens when the request has no max_tokens
    fail_status: int | None = None  # answer completions with this status ...
    fail_count: int | None = None  # ... this many times (None: always)
    health_status: int = 200
    kv_usage: float = 0.0  # reported vllm:kv_cache_usage_perc
    extra_running: int = 0
    waiting: int = 0
    break_after: int | None = None  # streams: abort the connection after this many chunks
    reset_on_request: bool = False  # abort the connection as soon as a completion arrives
    hang: bool = False  # never answer completions
    gate: asyncio.Queue | None = None  # streams: take one item before each chunk after the first
    max_tokens_cap: int | None = None  # answer at most this many tokens (fuzzed bodies ask for 2**53)
    hold: asyncio.Event | None = None  # completions wait for this before answering (a full replica)
    slots: int | None = None  # serve at most this many at once, the rest wait in FIFO order (vLLM's queue)
    stall_first: bool = False  # streams: send the head, then never the first chunk (prefill hung)
    kv_role: str | None = None  # "prefill" or "decode": one side of a disaggregated group (see above)
    kv_store: dict | None = None  # a group's KV handed over: remote_request_id -> the prefill's kv_transfer_params
    kv_missing: bool = False  # prefill: answer without kv_transfer_params (the one token was already a stop)


PREFILL_KV_PARAMS = {"do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
                     "remote_block_ids": None, "remote_host": None, "remote_port": None}


@dataclass
class Record:
    path: str
    headers: CIMultiDict
    body: bytes


class FakeVllm:
    def __init__(self, name: str, model: str = "tiny", **behavior):
        self.name = name
        self.model = model
        self.b = Behavior(**behavior)
        self.records: list[Record] = []
        self.inflight = 0
        self.completed = 0
        self.cancelled = 0
        self.health_polls = 0
        self.metrics_polls = 0
        self.ahead: list[int] = []  # per completion request: how many were in flight when it arrived
        self.peak_inflight = 0
        self.kv_handed: list[dict] = []  # prefill: the kv_transfer_params answered, in order
        self.local_prefills = 0  # decode: requests that came without kv_transfer_params
        self._slots: asyncio.Semaphore | None = None
        self._runner: web.AppRunner | None = None
        self.port: int | None = None
        self._ids = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    # -- lifecycle ---------------------------------------------------------------------------

    async def start(self, port: int = 0) -> "FakeVllm":
        app = web.Application()
        app.router.add_post("/v1/completions", self._completions)
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/health", self._health)
        app.router.add_get("/metrics", self._metrics)
        self._runner = web.AppRunner(app, handler_cancellation=True, access_log=None, shutdown_timeout=0.1)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", port)
        await site.start()
        self.port = self._runner.addresses[0][1]
        return self

    async def stop(self) -> None:
        if self._runner is not None:
            r, self._runner = self._runner, None
            await r.cleanup()

    async def __aenter__(self) -> "FakeVllm":
        return await self.start()

    async def __aexit__(self, *exc) -> None:
        await self.stop()

    # -- handlers ----------------------------------------------------------------------------

    async def _health(self, request: web.Request) -> web.Response:
        self.health_polls += 1
        return web.Response(status=self.b.health_status)

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": self.model, "object": "model", "max_model_len": 256}]})

    async def _metrics(self, request: web.Request) -> web.Response:
        self.metrics_polls += 1
        lab = f'engine="0",model_name="{self.model}"'
        text = (
            "# HELP vllm:num_requests_running Number of requests in model execution batches.\n"
            "# TYPE vllm:num_requests_running gauge\n"
            f"vllm:num_requests_running{{{lab}}} {float(self.inflight + self.b.extra_running)}\n"
            "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.\n"
            "# TYPE vllm:num_requests_waiting gauge\n"
            f"vllm:num_requests_waiting{{{lab}}} {float(self.b.waiting)}\n"
            "# HELP vllm:num_requests_waiting_by_reason Number of requests waiting, by reason.\n"
            "# TYPE vllm:num_requests_waiting_by_reason gauge\n"
            f'vllm:num_requests_waiting_by_reason{{{lab},reason="capacity"}} 7.0\n'
            "# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.\n"
            "# TYPE vllm:kv_cache_usage_perc gauge\n"
            f"vllm:kv_cache_usage_perc{{{lab}}} {self.b.kv_usage}\n"
            "# HELP vllm:prompt_tokens_total Number of prefill tokens processed.\n"
            "# TYPE vllm:prompt_tokens_total counter\n"
            f"vllm:prompt_tokens_total{{{lab}}} 0.0\n"
        )
        return web.Response(text=text, content_type="text/plain")

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, chat=False)

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, chat=True)

    async def _serve(self, request: web.Request, chat: bool) -> web.StreamResponse:
        body = await request.read()
        self.records.append(Record(request.path_qs, CIMultiDict(request.headers), body))
        b = self.b
        if b.reset_on_request:
            request.transport.abort()
            await asyncio.sleep(3600)  # the handler is cancelled with the connection
        req = json.loads(body)
        if req.get("model") not in (None, self.model):
            return self._error(404, f"The model `{req.get('model')}` does not exist.", "NotFoundError")
        if b.fail_status is not None and (b.fail_count is None or b.fail_count > 0):
            if b.fail_count is not None:
                b.fail_count -= 1
            return self._error(b.fail_status, "engine failed", "InternalServerError")
        problem = self._kv_check(req)
        if problem is not None:
            return self._error(400, problem, "BadRequestError")
        self.ahead.append(self.inflight)
        self.inflight += 1
        self.peak_inflight = max(self.peak_inflight, self.inflight)
        try:
            if b.hang:
                await asyncio.sleep(3600)
            if b.hold is not None:
                await b.hold.wait()
            if b.slots is not None:
                if self._slots is None:
                    self._slots = asyncio.Semaphore(b.slots)
                async with self._slots:  # FIFO: asyncio's semaphore wakes waiters in order
                    return await self._answer(request, req, b, chat)
            return await self._answer(request, req, b, chat)
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        except ConnectionResetError:
            self.cancelled += 1
            raise
        finally:
            self.inflight -= 1

    async def _answer(self, request: web.Request, req: dict, b: Behavior, chat: bool) -> web.StreamResponse:
        """Generate the answer (after any wait above): the delay, then the tokens."""
        if b.delay:
            await asyncio.sleep(b.delay)
        n = (req.get("max_completion_tokens") if chat else None) or req.get("max_tokens") or b.tokens
        if not isinstance(n, (int, float)):
            return self._error(400, "max_tokens: Input should be a valid integer", "BadRequestError")  # vLLM's pydantic
        n = int(n)  # 5.0 as vLLM takes it
        if b.max_tokens_cap is not None:
            n = max(0, min(n, b.max_tokens_cap))
        self._ids += 1
        rid = f"{'chatcmpl' if chat else 'cmpl'}-{self.name}-{self._ids}"
        if req.get("stream"):
            resp = await self._stream(request, rid, n, chat)
        else:
            resp = self._whole(rid, n, chat, self._handed_kv(rid))
        self.completed += 1
        return resp

    def _kv_check(self, req: dict) -> str | None:
        """What a disaggregated vLLM would refuse in this request (None: nothing)."""
        b = self.b
        kv = req.get("kv_transfer_params")
        if b.kv_role == "prefill":
            if kv != PREFILL_KV_PARAMS:
                return f"prefill: kv_transfer_params {kv!r} are not a remote-decode prefill's"
            if req.get("stream") is not False or req.get("max_tokens") != 1 or "stream_options" in req:
                return "prefill: wants stream false, max_tokens 1 and no stream_options"
            if req.get("max_completion_tokens", 1) != 1 or "min_tokens" in req or "min_completion_tokens" in req:
                return "prefill: max_completion_tokens must be 1 and min_tokens absent"
        elif b.kv_role == "decode":
            if kv is None:
                self.local_prefills += 1
            elif b.kv_store is None or b.kv_store.pop(kv.get("remote_request_id"), None) != kv:
                return f"decode: kv_transfer_params {kv!r} match no prefill's KV (or it was read already)"
        return None

    def _handed_kv(self, rid: str) -> dict | None:
        """A prefill's kv_transfer_params for its answer, kept for the decode that will read them."""
        b = self.b
        if b.kv_role != "prefill" or b.kv_missing:
            return None
        kv = {"do_remote_prefill": True, "do_remote_decode": False, "remote_block_ids": [self._ids, self._ids + 1],
              "remote_engine_id": f"engine-{self.name}", "remote_request_id": rid, "remote_host": "127.0.0.1",
              "remote_port": 5600, "tp_size": 1}
        if b.kv_store is not None:
            b.kv_store[rid] = kv
        self.kv_handed.append(kv)
        return kv

    def _error(self, status: int, msg: str, type_: str) -> web.Response:
        return web.json_response({"error": {"message": msg, "type": type_, "param": None, "code": status}}, status=status)

    def _whole(self, rid: str, n: int, chat: bool, kv: dict | None = None) -> web.Response:
        text = "".join(f" w{i}" for i in range(n))
        usage = {"prompt_tokens": 4, "total_tokens": 4 + n, "completion_tokens": n}
        if chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "length"}
            obj = "chat.completion"
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": "length", "stop_reason": None}
            obj = "text_completion"
        body = {"id": rid, "object": obj, "created": int(time.time()), "model": self.model, "choices": [choice], "usage": usage}
        if self.b.kv_role is not None:
            body["kv_transfer_params"] = kv  # vLLM's answer has the key, null when nothing was handed over
        return web.json_response(body, headers={"X-Backend": self.name})

    def _chunk(self, rid: str, i: int, n: int, chat: bool) -> bytes:
        last = i == n - 1
        if chat:
            delta = {"role": "assistant", "content": f" w{i}"} if i == 0 else {"content": f" w{i}"}
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": "length" if last else None}
            obj = "chat.completion.chunk"
        else:
            choice = {"index": 0, "text": f" w{i}", "logprobs": None, "finish_reason": "length" if last else None}
            obj = "text_completion"
        d = {"id": rid, "object": obj, "created": 0, "model": self.model, "choices": [choice]}
        return b"data: " + json.dumps(d).encode() + b"\n\n"

    async def _stream(self, request: web.Request, rid: str, n: int, chat: bool) -> web.StreamResponse:
        b = self.b
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream; charset=utf-8", "X-Backend": self.name})
        await resp.prepare(request)
        if b.stall_first:
            await asyncio.sleep(3600)  # headers out, no token: what a hung prefill looks like
        for i in range(n):
            if i > 0:
                if b.gate is not None:
                    await b.gate.get()
                if b.chunk_delay:
                    await asyncio.sleep(b.chunk_delay)
            if b.break_after is not None and i >= b.break_after:
                # half an event, then the connection dies: what a crashing replica looks like
                await resp.write(b'data: {"id": "' + rid.encode())
                await asyncio.sleep(0.01)
                request.transport.abort()
                await asyncio.sleep(3600)
            await resp.write(self._chunk(rid, i, n, chat))
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp


async def _main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--name", default="p")
    p.add_argument("--model", default="tiny")
    p.add_argument("--delay", type=float, default=0.0)
    a = p.parse_args()
    f = await FakeVllm(a.name, a.model, delay=a.delay).start()
    print(f"PORT {f.port}", flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(_main())
