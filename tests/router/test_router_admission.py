"""The router protects the plan's promise (issue 18, item 4): per-replica admission bounds from the
routing table give 429 + Retry-After beyond the planned load, the queue of what was admitted stays
bounded, nothing admitted is lost, started streams are never cut, and a replica that accepts
requests but never sends a first byte is left on its first-byte timeout, with failover.

Every assertion is on counts and status codes; the waits are conditions with generous bounds.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from types import SimpleNamespace

import aiohttp
import pytest

from hetcompile.passes.route import admission
from hetcompile.router import RouterOptions
from hetcompile.router.options import build, build_parser
from hetcompile.router.table import RouterError

from .fake_vllm import FakeVllm
from .util import replica, running_router, table, wait_for, write_table

C, Q = 2, 3  # planned concurrency and queue per replica: admission bound 5
BOUND = C + Q
H = 1.5  # capacity, req/s: Retry-After = ceil(Q / H) = 2
PLAIN = {"model": "tiny", "prompt": "hello", "max_tokens": 2}
STREAM = {"model": "tiny", "prompt": "hello", "max_tokens": 4, "stream": True}


def planned(id: str, url: str, **kw) -> dict:
    """A replica entry with the admission fields the route pass writes."""
    return replica(id, url, **{"planned_concurrency": C, "max_queue": Q, "capacity_requests_per_s": H, **kw})


async def call(s: aiohttp.ClientSession, url: str, body: dict) -> tuple[int, bytes, dict]:
    async with s.post(url + "/v1/completions", json=body, timeout=aiohttp.ClientTimeout(total=60)) as r:
        return r.status, await r.read(), dict(r.headers)


def stream_complete(raw: bytes, n: int) -> bool:
    """Every token event, whole, then [DONE]: nothing was cut."""
    events = raw.split(b"\n\n")
    if events[-1] != b"" or events[-2] != b"data: [DONE]":
        return False
    return [json.loads(e[6:])["choices"][0]["text"] for e in events[:-2]] == [f" w{i}" for i in range(n)]


async def test_overload_beyond_the_plan_gets_429_and_admitted_requests_all_complete(tmp_path):
    hold = asyncio.Event()  # the replicas answer nothing until the burst has been sorted out
    async with FakeVllm("a", hold=hold) as a, FakeVllm("b", hold=hold) as b:
        t = table([planned("a", a.url), planned("b", b.url)])
        async with running_router(write_table(tmp_path / "routing.json", t)) as r:
            n = 40  # 4x what the two replicas were sized to hold
            async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as s:
                bodies = [STREAM if i % 2 else PLAIN for i in range(n)]
                tasks = [asyncio.ensure_future(call(s, r.url, body)) for body in bodies]
                await wait_for(lambda: r.metrics.rejected.get(("tiny", "default")) == n - 2 * BOUND, timeout=30)
                await wait_for(lambda: a.inflight + b.inflight == 2 * BOUND, timeout=30)
                assert (a.inflight, b.inflight) == (BOUND, BOUND)  # the bound held on each replica
                hold.set()
                res = await asyncio.gather(*tasks)
            codes = Counter(st for st, _, _ in res)
            assert codes == {200: 2 * BOUND, 429: n - 2 * BOUND}
            for (st, raw, h), body in zip(res, bodies):
                if st == 429:
                    err = json.loads(raw)["error"]
                    assert h["Retry-After"] == "2"
                    assert err["type"] == "RateLimitError" and err["code"] == 429 and err["param"] is None
                    assert "retry after 2 s" in err["message"]
                elif body.get("stream"):
                    assert stream_complete(raw, 4)
                else:
                    assert json.loads(raw)["choices"][0]["text"] == " w0 w1"
            # nothing admitted is lost: every admitted request completed on a replica, once
            assert a.completed + b.completed == 2 * BOUND and a.cancelled == b.cancelled == 0
            assert a.peak_inflight == b.peak_inflight == BOUND
            async with aiohttp.ClientSession() as s:
                async with s.get(r.url + "/metrics") as resp:
                    text = await resp.text()
            assert f'hetcompile_router_max_inflight{{replica="a"}} {BOUND}' in text
            assert f'hetcompile_router_rejected_total{{model="tiny",class="default"}} {n - 2 * BOUND}' in text
            assert f'hetcompile_router_requests_total{{model="tiny",class="default",code="429"}} {n - 2 * BOUND}' in text


async def sustained(tmp_path, n: int, **opts) -> tuple[Counter, list[FakeVllm]]:
    """n requests from 40 concurrent clients against two replicas that serve C at a time (FIFO
    queue behind), each answer 20 ms: offered load far beyond what the plan was sized for."""
    async with FakeVllm("a", slots=C, delay=0.02) as a, FakeVllm("b", slots=C, delay=0.02) as b:
        t = table([planned("a", a.url), planned("b", b.url)])
        async with running_router(write_table(tmp_path / "routing.json", t), **opts) as r:
            sem = asyncio.Semaphore(40)
            async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as s:

                async def one(i: int):
                    async with sem:
                        st, raw, _ = await call(s, r.url, STREAM if i % 3 == 0 else PLAIN)
                        assert st == 429 or (st == 200 and (i % 3 != 0 or stream_complete(raw, 4)))
                        return st

                codes = Counter(await asyncio.gather(*(one(i) for i in range(n))))
            await wait_for(lambda: a.inflight == b.inflight == 0)
            assert a.cancelled == b.cancelled == 0  # nothing admitted was abandoned
            assert codes[200] == a.completed + b.completed  # and every one admitted was answered
            return codes, [a, b]


async def test_sustained_overload_keeps_the_queue_of_admitted_requests_bounded(tmp_path):
    n = 300
    codes, fakes = await sustained(tmp_path, n)
    assert set(codes) == {200, 429} and sum(codes.values()) == n
    # an admitted request finds at most BOUND - 1 ahead of it: C running and the rest queued,
    # so its TTFT is at most ceil(BOUND / C) service times, however many clients push
    for f in fakes:
        assert max(f.ahead) <= BOUND - 1


async def test_without_bounds_the_queue_grows_with_the_offered_load(tmp_path):
    # the same load with admission off (--max-inflight 0): what the bound protects against
    n = 120
    codes, fakes = await sustained(tmp_path, n, max_inflight=0)
    assert codes == {200: n}
    assert max(max(f.ahead) for f in fakes) > BOUND


async def test_started_streams_are_never_cut_by_overload_or_a_smaller_bound(tmp_path):
    gate: asyncio.Queue = asyncio.Queue()  # the replica stalls each stream after its first chunk
    async with FakeVllm("a", gate=gate) as a:
        path = write_table(tmp_path / "routing.json", table([planned("a", a.url)]))
        async with running_router(path) as r:
            async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as s:
                streams = [asyncio.ensure_future(call(s, r.url, STREAM)) for _ in range(BOUND)]
                await wait_for(lambda: a.inflight == BOUND, timeout=30)
                for _ in range(10):  # the replica is full: new requests are refused ...
                    assert (await call(s, r.url, PLAIN))[0] == 429
                # ... and a reload that shrinks the bound below what runs refuses, never cuts
                write_table(path, table([replica("a", a.url, planned_concurrency=1, max_queue=0)]))
                r.reload_now()
                assert r.table.replicas["a"].max_inflight == 1
                assert (await call(s, r.url, PLAIN))[0] == 429
                for _ in range(3 * BOUND):
                    gate.put_nowait(None)
                res = await asyncio.gather(*streams)
            assert all(st == 200 and stream_complete(raw, 4) for st, raw, _ in res)
            assert a.cancelled == 0 and r.table.replicas["a"].inflight == 0


def test_limits_come_from_the_table_and_can_be_overridden(tmp_path):
    from hetcompile.router.app import Router

    path = write_table(tmp_path / "routing.json", table([planned("a", "http://127.0.0.1:1"), replica("b", "http://127.0.0.1:2")]))
    st = Router(path).table.replicas
    assert st["a"].max_inflight == BOUND and st["b"].max_inflight is None  # b: an old-style table entry
    assert st["a"].first_byte_timeout == 30.0  # no first_byte_timeout_s in the table: the default
    st = Router(path, options=RouterOptions(max_inflight=0, first_byte_timeout=7.0)).table.replicas
    assert st["a"].max_inflight is None and st["a"].first_byte_timeout == 7.0
    st = Router(path, options=RouterOptions(max_inflight=9)).table.replicas
    assert st["a"].max_inflight == st["b"].max_inflight == 9
    a = build_parser().parse_args(["--table", str(path), "--max-inflight", "12", "--first-byte-timeout", "4.5"])
    options, _ = build(a)
    assert options.max_inflight == 12 and options.first_byte_timeout == 4.5
    with pytest.raises(RouterError):
        RouterOptions(max_inflight=-1)
    with pytest.raises(RouterError):
        RouterOptions(first_byte_timeout=0)


def test_route_pass_sizes_the_queue_to_drain_within_the_ttft_budget():
    est = SimpleNamespace(concurrency=(("chat", 40.0), ("rag", 10.0)), throughput_rps=(("chat", 8.0), ("rag", 2.0)),
                          ttft_s=(("chat", 0.2), ("rag", 1.5)))
    rep = SimpleNamespace(estimate=est)
    ws = {"chat": SimpleNamespace(ttft_slo=2.0), "rag": SimpleNamespace(ttft_slo=None)}
    only_chat = admission(rep, ws, {"chat": 3.0, "rag": 0.0})
    # C = 40, Q = floor(8 req/s x 2 s): the queue ahead of a newcomer drains within its TTFT SLO
    assert only_chat["planned_concurrency"] == 40 and only_chat["max_queue"] == 16
    assert only_chat["first_byte_timeout_s"] == pytest.approx(4 * (2.0 + 0.2))
    only_rag = admission(rep, ws, {"rag": 1.0})
    # no SLO: the budget is 4x the predicted TTFT (6 s), Q = floor(2 x 6)
    assert only_rag["max_queue"] == 12 and only_rag["first_byte_timeout_s"] == 4 * (6.0 + 1.5)
    mix = admission(rep, ws, {"chat": 1.0, "rag": 1.0})  # the planned mix, rate-weighted
    assert mix["planned_concurrency"] == 25 and mix["max_queue"] == 14 and mix["capacity_requests_per_s"] == 5.0


def test_every_golden_routing_table_states_limits():
    from pathlib import Path

    from hetcompile.plan.routing import RoutingTable

    tables = sorted(Path(__file__).resolve().parents[1].glob("golden/*/router/routing.json"))
    assert tables
    for p in tables:
        t = RoutingTable.model_validate_json(p.read_text())
        for rep in t.replicas:
            assert rep.planned_concurrency >= 1 and rep.max_queue >= 1 and rep.capacity_requests_per_s > 0, (p, rep.id)
            assert 5.0 <= rep.first_byte_timeout_s <= 60.0, (p, rep.id)


# -- a replica that accepts requests and never answers, /health 200 all along ---------------------


FAST_DECODE = dict(decode_tokens_per_s=1e6)  # a plain answer's allowance for its tokens is ~0


async def test_hung_replica_is_ejected_on_first_byte_and_requests_fail_over(tmp_path):
    async with FakeVllm("a", hang=True) as a, FakeVllm("b") as b:
        # b's first-byte timeout is the default's 30 s: b is not what is tested, and at 0.3 s a busy
        # machine (CI's other worker building an example) delayed b's first bytes past it, so b was
        # ejected too and 5 of 80 requests got 502
        t = table([planned("a", a.url, first_byte_timeout_s=0.3, **FAST_DECODE),
                   planned("b", b.url, first_byte_timeout_s=30.0, max_queue=200, **FAST_DECODE)])  # fmt: skip
        # the whole-request read timeout is far away: only the first-byte timeout can act
        async with running_router(write_table(tmp_path / "routing.json", t), read_timeout=600.0) as r:
            n = 80
            sem = asyncio.Semaphore(20)
            async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as s:

                async def one(i: int):
                    async with sem:
                        st, raw, h = await call(s, r.url, STREAM if i % 2 else PLAIN)
                        return st, h.get("X-Hetcompile-Replica"), i % 2 == 0 or stream_complete(raw, 4)

                res = await asyncio.gather(*(one(i) for i in range(n)))
            assert Counter((st, rep, ok) for st, rep, ok in res) == {(200, "b", True): n}
            st_a = r.table.replicas["a"]
            assert not st_a.healthy  # ejected by live traffic although /health said 200
            assert r.metrics.errors.get(("first_byte_timeout",)) >= 3  # fail_threshold
            # a got at most its admission bound before it was full, plus what raced the ejection
            assert len(a.records) <= 2 * BOUND
            await wait_for(lambda: a.cancelled == len(a.records))  # every hung attempt abandoned upstream


async def test_stream_whose_first_chunk_never_comes_fails_over(tmp_path):
    # vLLM sends a stream's head at once and the first chunk after prefill: a hung prefill
    async with FakeVllm("a", stall_first=True) as a, FakeVllm("b") as b:
        t = table([replica("a", a.url), replica("b", b.url, first_byte_timeout_s=30.0)])  # b: not under test (above)
        async with running_router(write_table(tmp_path / "routing.json", t), read_timeout=600.0, first_byte_timeout=0.3) as r:
            async with aiohttp.ClientSession() as s:
                res = [await call(s, r.url, STREAM) for _ in range(6)]
            assert all(st == 200 and h["X-Hetcompile-Replica"] == "b" and stream_complete(raw, 4) for st, raw, h in res)
            assert r.metrics.errors.get(("first_byte_timeout",)) == 3 and not r.table.replicas["a"].healthy


async def test_slow_plain_answer_within_its_token_allowance_is_not_cut(tmp_path):
    # a plain answer arrives whole after its last token: its deadline adds max_tokens x the
    # slowest planned decode (2 x max_num_seqs / decode_tokens_per_s = 0.5 s a token here)
    async with FakeVllm("a", delay=0.6) as a:
        t = table([replica("a", a.url, first_byte_timeout_s=0.2)])
        async with running_router(write_table(tmp_path / "routing.json", t), read_timeout=600.0) as r:
            async with aiohttp.ClientSession() as s:
                st, raw, _ = await call(s, r.url, PLAIN)  # deadline 0.2 + 2 x 0.512 s
                assert st == 200 and a.cancelled == 0
                st, raw, _ = await call(s, r.url, {**STREAM, "max_tokens": 2})  # a stream gets 0.2 s
                assert st == 502 and r.metrics.errors.get(("first_byte_timeout",)) == 3
