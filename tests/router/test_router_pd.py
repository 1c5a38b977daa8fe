"""Prefill/decode disaggregation (issue 35): the table's groups, the two-step flow through fake
NIXL prefill and decode replicas (fake_vllm.py checks what each is sent), failover on either
side, the errors, admission and the per-role metrics."""

from __future__ import annotations

import asyncio
import json
import socket

import aiohttp
from aiohttp import web
import pytest
from pydantic import ValidationError

from hetcompile.plan.canon import dumps_json
from hetcompile.plan.routing import RoutingTable
from hetcompile.router.disagg import PREFILL_KV_PARAMS, answered_kv_params, decode_body, prefill_body
from hetcompile.router.table import RouterError, compile_table, load_table

from .fake_vllm import PREFILL_KV_PARAMS as FAKE_PREFILL_KV_PARAMS
from .fake_vllm import FakeVllm
from .test_router_metrics import check_exposition
from .util import klass, post, replica, running_router, table, write_table

BODY = {"model": "tiny", "prompt": "hello there", "max_tokens": 4}
CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 4, "min_tokens": 2}


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # nothing listens here once the socket is closed


def group(id: str, prefill: list[str], decode: list[str], model: str = "tiny", **kw) -> dict:
    g = {
        "id": id,
        "model": model,
        "prefill": [{"replica": r, "weight": 1.0 / len(prefill)} for r in sorted(prefill)],
        "decode": [{"replica": r, "weight": 1.0 / len(decode)} for r in sorted(decode)],
    }
    g.update(kw)
    return g


def pd_table(prefill: dict[str, str | None], decode: dict[str, str | None], others: dict[str, str] | None = None,
             weights: dict[str, float] | None = None, **kw) -> dict:
    """One model `tiny`, one group `g` of the given prefill and decode replicas (id -> endpoint),
    optional aggregated replicas; the class weights the group (or `weights`)."""
    reps = [replica(i, e, role="prefill", **kw) for i, e in prefill.items()]
    reps += [replica(i, e, role="decode", **kw) for i, e in decode.items()]
    reps += [replica(i, e) for i, e in (others or {}).items()]
    return table(reps, models={"tiny": [klass("default", weights or {"g": 1.0})]},
                 groups=[group("g", list(prefill), list(decode))])


async def fakes(*specs: tuple[str, str], store: dict | None = None, **behavior) -> list[FakeVllm]:
    """Started fakes, (name, kv_role) each, sharing one KV store."""
    store = {} if store is None else store
    return [await FakeVllm(name, kv_role=role, kv_store=store, **behavior).start() for name, role in specs]


async def stop_all(fs: list[FakeVllm]) -> None:
    for f in fs:
        await f.stop()


# -- the table ---------------------------------------------------------------------------------


def _base() -> dict:
    return pd_table({"p0": "http://127.0.0.1:1"}, {"d0": "http://127.0.0.1:2"}, others={"a": "http://127.0.0.1:3"},
                    weights={"g": 0.5, "a": 0.5})


def _invalid(edit) -> str:
    d = json.loads(json.dumps(_base()))
    edit(d)
    with pytest.raises(ValidationError) as e:
        RoutingTable.model_validate(d)
    return str(e.value)


def _replica_of(d: dict, rid: str) -> dict:
    return next(r for r in d["replicas"] if r["id"] == rid)


def _set_role(d: dict, rid: str, role: str | None) -> None:
    r = _replica_of(d, rid)
    if role is None:
        r.pop("role", None)
    else:
        r["role"] = role


def test_group_members_must_exist_have_their_side_role_and_serve_the_model():
    msg = _invalid(lambda d: d["groups"][0]["prefill"].append({"replica": "nope", "weight": 0.0}))
    assert "group g prefill weights unknown replica 'nope'" in msg
    msg = _invalid(lambda d: _set_role(d, "p0", "decode"))
    assert "group g lists 'p0' as prefill but it has role 'decode'" in msg
    msg = _invalid(lambda d: _set_role(d, "d0", None))
    assert "group g lists 'd0' as decode but it has no role (an aggregated replica)" in msg
    msg = _invalid(lambda d: _replica_of(d, "d0").update(model="big"))
    assert "group g serves model 'tiny' but its decode replica 'd0' serves 'big'" in msg
    msg = _invalid(lambda d: d["groups"][0].update(decode=[]))
    assert "decode" in msg and "at least 1 item" in msg


def test_class_weights_name_groups_not_their_members_and_ids_are_one_namespace():
    msg = _invalid(lambda d: d["models"][0]["classes"][0]["weights"].append({"replica": "p0", "weight": 0.1}))
    assert "class tiny/default weights 'p0', a prefill replica" in msg and "weight the group instead" in msg
    msg = _invalid(lambda d: d["models"][0]["classes"][0]["weights"].append({"replica": "zz", "weight": 0.1}))
    assert "class tiny/default weights unknown replica 'zz'" in msg
    msg = _invalid(lambda d: d["groups"].append(group("a", ["p0"], ["d0"])))
    assert "'a' is both a replica id and a group id" in msg
    msg = _invalid(lambda d: d["groups"].append(dict(d["groups"][0])))
    assert "group ids must be unique" in msg

    def other_model(d):
        d["groups"][0]["model"] = "big"
        for r in d["replicas"]:
            if r["id"] in ("p0", "d0"):
                r["model"] = "big"

    assert "class tiny/default weights group 'g', which serves model 'big'" in _invalid(other_model)


def test_invalid_group_file_is_a_router_error(tmp_path):
    d = _base()
    d["models"][0]["classes"][0]["weights"] = [{"replica": "d0", "weight": 1.0}]
    path = tmp_path / "routing.json"
    path.write_text(json.dumps(d))
    with pytest.raises(RouterError, match="a decode replica"):
        load_table(path)


def test_tables_without_groups_are_written_as_before_and_groups_round_trip():
    plain = RoutingTable.model_validate(table([replica("a", "http://127.0.0.1:1")]))
    dumped = plain.model_dump(mode="json")
    assert "groups" not in dumped and all("role" not in r for r in dumped["replicas"])
    pd = RoutingTable.model_validate(_base())
    text = dumps_json(pd.model_dump(mode="json"))
    again = RoutingTable.model_validate_json(text)
    assert again == pd and again.groups[0].kv_connector == "NixlConnector"
    assert {r.id: r.role for r in again.replicas} == {"a": None, "d0": "decode", "p0": "prefill"}


def test_compiled_group_is_a_class_candidate_and_keeps_its_counters_across_reloads():
    t = compile_table(RoutingTable.model_validate(_base()))
    g = t.groups["g"]
    cands = t.models["tiny"].classes[0].picker.replicas
    assert [c.id for c in cands] == ["a", "g"] and cands[1] is g
    assert [r.id for r in g.prefill.replicas] == ["p0"] and [r.id for r in g.decode.replicas] == ["d0"]
    assert g.routable and g.endpoint is not None and g.has_room()
    assert g.prefill_tps == 10_000.0 and g.kv_capacity == 100_000
    lease = g.acquire(10.0, 1.0)
    t2 = compile_table(RoutingTable.model_validate(_base()), t.replicas, previous_groups=t.groups)
    assert t2.groups["g"] is g and g.inflight == 1
    lease.release()
    assert g.inflight == 0 and g.load == 0.0
    # a class with no positive weight spreads over aggregated replicas and groups, never members
    d = _base()
    d["models"][0]["classes"][0]["weights"] = [{"replica": "g", "weight": 0.0}]
    t3 = compile_table(RoutingTable.model_validate(d))
    assert [c.id for c in t3.models["tiny"].classes[0].picker.replicas] == ["a", "g"]
    # a group with no deployed decode is not deployed
    d = pd_table({"p0": "http://127.0.0.1:1"}, {"d0": None})
    g4 = compile_table(RoutingTable.model_validate(d)).groups["g"]
    assert g4.endpoint is None and not g4.routable


def test_prefill_and_decode_bodies():
    chat = dict(CHAT, stream=True, stream_options={"include_usage": True}, min_completion_tokens=1)
    p = json.loads(prefill_body(chat))
    assert p["kv_transfer_params"] == PREFILL_KV_PARAMS == FAKE_PREFILL_KV_PARAMS
    assert p["stream"] is False and p["max_tokens"] == 1 and p["max_completion_tokens"] == 1
    assert not {"stream_options", "min_tokens", "min_completion_tokens"} & set(p)
    assert p["messages"] == chat["messages"]
    assert "max_completion_tokens" not in json.loads(prefill_body(BODY))
    kv = {"do_remote_prefill": True, "remote_block_ids": [1, 2], "remote_request_id": "x", "tp_size": 2}
    assert json.loads(decode_body(chat, kv)) == dict(chat, kv_transfer_params=kv)
    assert json.loads(decode_body(dict(BODY, kv_transfer_params={"x": 1}), None)) == BODY
    assert answered_kv_params(json.dumps({"kv_transfer_params": kv}).encode()) == kv
    assert answered_kv_params(b'{"kv_transfer_params": null}') is None and answered_kv_params(b"{}") is None
    for bad in (b"<html>", b"[1]", b'{"kv_transfer_params": "x"}', b"\xff"):
        with pytest.raises(ValueError):
            answered_kv_params(bad)


# -- the flow ----------------------------------------------------------------------------------


def _sent(f: FakeVllm, i: int = -1) -> dict:
    return json.loads(f.records[i].body)


async def test_plain_completion_and_chat_go_prefill_then_decode(tmp_path):
    fs = await fakes(("p0", "prefill"), ("d0", "decode"))
    p0, d0 = fs
    try:
        t = pd_table({"p0": p0.url}, {"d0": d0.url})
        async with running_router(write_table(tmp_path / "routing.json", t), health_interval=30.0) as r:
            async with aiohttp.ClientSession() as s:
                status, body, h = await post(s, r.url + "/v1/completions", BODY, headers={"X-Request-Id": "client-1"})
                assert status == 200 and h["X-Hetcompile-Replica"] == "d0"
                assert body["id"].startswith("cmpl-d0-") and body["choices"][0]["text"] == " w0 w1 w2 w3"
                # the prefill got the rewritten body; the decode the client's, with exactly the prefill's params
                assert _sent(p0) == dict(BODY, kv_transfer_params=PREFILL_KV_PARAMS, stream=False, max_tokens=1)
                assert _sent(d0) == dict(BODY, kv_transfer_params=p0.kv_handed[-1])
                # one request id for the pair, the client's kept as its prefix
                rid = p0.records[-1].headers["X-Request-Id"]
                assert rid.startswith("client-1-") and d0.records[-1].headers["X-Request-Id"] == rid

                status, body, h = await post(s, r.url + "/v1/chat/completions", CHAT)
                assert status == 200 and body["object"] == "chat.completion" and h["X-Hetcompile-Replica"] == "d0"
                sent = _sent(p0)
                assert sent["max_tokens"] == 1 and sent["max_completion_tokens"] == 1 and "min_tokens" not in sent
                assert _sent(d0) == dict(CHAT, kv_transfer_params=p0.kv_handed[-1])
            assert d0.local_prefills == 0 and len(p0.kv_handed) == 2
            # every lease went back: the members', and the group's own
            assert all(x.inflight == 0 and x.inflight_kv == 0.0 for x in r.table.replicas.values())
            assert r.table.groups["g"].inflight == 0
    finally:
        await stop_all(fs)


async def _read_events(resp: aiohttp.ClientResponse, n: int) -> list[bytes]:
    """The first `n` SSE events of a response, as they arrive."""
    buf = b""
    while buf.count(b"\n\n") < n:
        chunk = await resp.content.readany()
        assert chunk, "stream ended early"
        buf += chunk
    return buf.split(b"\n\n")[:n]


@pytest.mark.parametrize("chat", [False, True])
async def test_streaming_is_passed_through_chunk_by_chunk(tmp_path, chat):
    gate: asyncio.Queue = asyncio.Queue()
    fs = await fakes(("p0", "prefill"), ("d0", "decode"))
    p0, d0 = fs
    d0.b.gate = gate  # the decode sends its first chunk, then one more per item
    try:
        t = pd_table({"p0": p0.url}, {"d0": d0.url})
        body = dict(CHAT if chat else BODY, stream=True, stream_options={"include_usage": True})
        path = "/v1/chat/completions" if chat else "/v1/completions"
        async with running_router(write_table(tmp_path / "routing.json", t), health_interval=30.0) as r:
            async with aiohttp.ClientSession() as s:
                async with s.post(r.url + path, json=body) as resp:
                    assert resp.status == 200 and resp.headers["Content-Type"].startswith("text/event-stream")
                    assert resp.headers["X-Hetcompile-Replica"] == "d0"
                    # the first event reached the client while the decode still holds the rest
                    first = await _read_events(resp, 1)
                    assert json.loads(first[0][len(b"data: "):])["id"].startswith("chatcmpl-d0-" if chat else "cmpl-d0-")
                    for _ in range(3):
                        gate.put_nowait(None)
                    rest = (await resp.read()).split(b"\n\n")
                    assert b"data: [DONE]" in rest and sum(e.startswith(b"data: {") for e in rest) == 3
            sent = _sent(p0)
            assert sent["stream"] is False and "stream_options" not in sent and sent["max_tokens"] == 1
            assert _sent(d0) == dict(body, kv_transfer_params=p0.kv_handed[-1])
            assert r.table.replicas["d0"].inflight == 0 and r.table.groups["g"].inflight == 0
    finally:
        await stop_all(fs)


async def test_prefill_failure_fails_over_to_another_prefill(tmp_path):
    fs = await fakes(("p0", "prefill"), ("p1", "prefill"), ("d0", "decode"))
    p0, p1, d0 = fs
    p0.b.fail_status = 500
    try:
        t = pd_table({"p0": p0.url, "p1": p1.url}, {"d0": d0.url})
        async with running_router(write_table(tmp_path / "routing.json", t), health_interval=30.0, fail_threshold=1000) as r:
            async with aiohttp.ClientSession() as s:
                for _ in range(4):
                    status, body, h = await post(s, r.url + "/v1/completions", BODY)
                    assert status == 200 and h["X-Hetcompile-Replica"] == "d0"
            assert len(p1.kv_handed) == 4 and not p0.kv_handed and len(p0.records) >= 1
            assert len(d0.records) == 4 and d0.local_prefills == 0  # each decode read a KV once
            assert r.metrics.retries.get(("p0",)) == len(p0.records)
            assert r.metrics.pd_attempts.get(("g", "prefill", "failed")) == len(p0.records)
            assert r.metrics.pd_attempts.get(("g", "prefill", "ok")) == 4
    finally:
        await stop_all(fs)


async def test_unreachable_or_hung_prefill_fails_over(tmp_path):
    fs = await fakes(("p1", "prefill"), ("p2", "prefill"), ("d0", "decode"))
    p1, p2, d0 = fs
    p1.b.hang = True  # accepts, never answers: the first-byte timeout abandons it
    try:
        t = pd_table({"p0": f"http://127.0.0.1:{closed_port()}", "p1": p1.url, "p2": p2.url}, {"d0": d0.url})
        _replica_of(t, "p1")["first_byte_timeout_s"] = 0.3  # the others keep the default (30 s)
        async with running_router(write_table(tmp_path / "routing.json", t), health_interval=30.0) as r:
            async with aiohttp.ClientSession() as s:
                status, _, h = await post(s, r.url + "/v1/completions", BODY)
            assert status == 200 and h["X-Hetcompile-Replica"] == "d0"
            assert len(p2.kv_handed) == 1 and len(p1.records) == 1
            assert r.metrics.errors.get(("upstream_connect",)) == 1 and r.metrics.errors.get(("first_byte_timeout",)) == 1
    finally:
        await stop_all(fs)


async def test_decode_failure_fails_over_after_a_new_prefill(tmp_path):
    fs = await fakes(("p0", "prefill"), ("d0", "decode"), ("d1", "decode"))
    p0, d0, d1 = fs
    d0.b.fail_status = 503
    try:
        t = pd_table({"p0": p0.url}, {"d0": d0.url, "d1": d1.url})
        async with running_router(write_table(tmp_path / "routing.json", t), health_interval=30.0) as r:
            async with aiohttp.ClientSession() as s:
                status, body, h = await post(s, r.url + "/v1/completions", BODY)
            assert status == 200 and h["X-Hetcompile-Replica"] == "d1" and body["id"].startswith("cmpl-d1-")
            # d0 (first on ties) failed; the KV was prefilled again, and d1 read the new one
            assert len(d0.records) == 1 and len(p0.kv_handed) == 2
            assert _sent(d0)["kv_transfer_params"] == p0.kv_handed[0]
            assert _sent(d1)["kv_transfer_params"] == p0.kv_handed[1]
            ids = [rec.headers["X-Request-Id"] for rec in (p0.records[0], d0.records[0], p0.records[1], d1.records[0])]
            assert ids[0] == ids[1] and ids[2] == ids[3] and ids[0] != ids[2]
            assert r.metrics.retries.get(("d0",)) == 1
            assert r.metrics.pd_attempts.get(("g", "decode", "failed")) == 1
            assert r.metrics.pd_attempts.get(("g", "decode", "ok")) == 1
    finally:
        await stop_all(fs)


async def test_streaming_decode_that_breaks_before_its_first_byte_fails_over(tmp_path):
    fs = await fakes(("p0", "prefill"), ("d0", "decode"), ("d1", "decode"))
    p0, d0, d1 = fs
    d0.b.stall_first = True  # sends the head, never a token
    try:
        t = pd_table({"p0": p0.url}, {"d0": d0.url, "d1": d1.url})
        _replica_of(t, "d0")["first_byte_timeout_s"] = 0.3
        async with running_router(write_table(tmp_path / "routing.json", t), health_interval=30.0) as r:
            async with aiohttp.ClientSession() as s:
                async with s.post(r.url + "/v1/completions", json=dict(BODY, stream=True)) as resp:
                    text = await resp.text()
                    assert resp.status == 200 and resp.headers["X-Hetcompile-Replica"] == "d1"
            assert text.endswith("data: [DONE]\n\n") and "cmpl-d1-" in text
            assert _sent(d1)["kv_transfer_params"] == p0.kv_handed[-1] and len(p0.kv_handed) == 2
    finally:
        await stop_all(fs)


async def test_every_attempt_failing_gives_an_openai_error(tmp_path):
    fs = await fakes(("p0", "prefill"), ("d0", "decode"))
    p0, d0 = fs
    p0.b.fail_status = 500
    try:
        t = pd_table({"p0": p0.url}, {"d0": d0.url})
        path = write_table(tmp_path / "routing.json", t)
        async with running_router(path, health_interval=30.0, fail_threshold=1000) as r:
            async with aiohttp.ClientSession() as s:
                status, body, _ = await post(s, r.url + "/v1/completions", BODY)
                assert status == 502 and body["error"]["type"] == "BadGatewayError" and body["error"]["code"] == 502
                assert "every prefill failed" in body["error"]["message"] and "p0: HTTP 500" in body["error"]["message"]
                assert len(p0.records) == 3 and not d0.records  # max_retries 2: three prefills, no decode
                assert r.metrics.errors.get(("exhausted",)) == 1

                # decodes that cannot be reached: each try prefills again, then 502 naming the decode
                p0.b.fail_status = None
                write_table(path, pd_table({"p0": p0.url}, {"d9": f"http://127.0.0.1:{closed_port()}"}))
                r.reload_now()
                status, body, _ = await post(s, r.url + "/v1/chat/completions", CHAT)
                assert status == 502 and body["error"]["type"] == "BadGatewayError"
                assert "every decode failed" in body["error"]["message"] and "d9" in body["error"]["message"]
                assert len(p0.kv_handed) == 3
            assert r.table.replicas["p0"].inflight == 0 and r.table.groups["g"].inflight == 0
    finally:
        await stop_all(fs)


async def test_decode_5xx_on_the_last_try_is_passed_through(tmp_path):
    fs = await fakes(("p0", "prefill"), ("d0", "decode"))
    p0, d0 = fs
    d0.b.fail_status = 500
    try:
        t = pd_table({"p0": p0.url}, {"d0": d0.url})
        async with running_router(write_table(tmp_path / "routing.json", t), health_interval=30.0, fail_threshold=1000) as r:
            async with aiohttp.ClientSession() as s:
                status, body, _ = await post(s, r.url + "/v1/completions", BODY)
            # as an aggregated replica's: the replica's own error object once the tries are spent
            assert status == 500 and body["error"]["message"] == "engine failed"
            assert len(d0.records) == 3 and len(p0.kv_handed) == 3
    finally:
        await stop_all(fs)


async def test_prefill_without_kv_params_lets_the_decode_compute_the_prompt(tmp_path):
    fs = await fakes(("p0", "prefill"), ("d0", "decode"))
    p0, d0 = fs
    p0.b.kv_missing = True  # vLLM: the one token was already a stop, nothing to hand over
    try:
        t = pd_table({"p0": p0.url}, {"d0": d0.url})
        async with running_router(write_table(tmp_path / "routing.json", t), health_interval=30.0) as r:
            async with aiohttp.ClientSession() as s:
                status, _, h = await post(s, r.url + "/v1/completions", dict(BODY, kv_transfer_params={"junk": 1}))
            assert status == 200 and h["X-Hetcompile-Replica"] == "d0"
            assert _sent(d0) == BODY and d0.local_prefills == 1 and len(p0.records) == 1
            assert r.metrics.pd_attempts.get(("g", "prefill", "no_kv_params")) == 1
    finally:
        await stop_all(fs)


async def test_prefill_refusing_the_request_answers_the_client(tmp_path):
    fs = await fakes(("p0", "prefill"), ("d0", "decode"))
    p0, d0 = fs
    p0.b.fail_status = 400
    try:
        t = pd_table({"p0": p0.url}, {"d0": d0.url})
        async with running_router(write_table(tmp_path / "routing.json", t), health_interval=30.0) as r:
            async with aiohttp.ClientSession() as s:
                status, body, h = await post(s, r.url + "/v1/completions", BODY)
            assert status == 400 and body["error"]["message"] == "engine failed" and h["X-Hetcompile-Replica"] == "p0"
            assert len(p0.records) == 1 and not d0.records
            assert r.metrics.pd_attempts.get(("g", "prefill", "client_error")) == 1
    finally:
        await stop_all(fs)


async def test_a_failed_group_falls_over_to_another_candidate_of_the_class(tmp_path):
    fs = await fakes(("d0", "decode"))
    async with FakeVllm("z") as z:
        try:
            t = pd_table({"p0": f"http://127.0.0.1:{closed_port()}"}, {"d0": fs[0].url}, others={"z": z.url},
                         weights={"g": 0.5, "z": 0.5})
            async with running_router(write_table(tmp_path / "routing.json", t), health_interval=30.0) as r:
                async with aiohttp.ClientSession() as s:
                    status, _, h = await post(s, r.url + "/v1/completions", BODY)
                # the group was chosen first (g < z), spent its prefill tries, then z answered
                assert status == 200 and h["X-Hetcompile-Replica"] == "z"
                assert r.metrics.errors.get(("pd_exhausted",)) == 1 and r.metrics.retries.get(("g",)) == 1
                assert not fs[0].records
        finally:
            await stop_all(fs)


async def test_the_decode_replica_holds_the_request_from_admission_and_a_full_one_gives_429(tmp_path):
    fs = await fakes(("p0", "prefill"), ("d0", "decode"))
    p0, d0 = fs
    p0.b.hold = asyncio.Event()  # the first request stays in its prefill
    try:
        t = table([replica("p0", p0.url, role="prefill"),
                   replica("d0", d0.url, role="decode", planned_concurrency=1, max_queue=0, capacity_requests_per_s=0.5)],
                  models={"tiny": [klass("default", {"g": 1.0})]}, groups=[group("g", ["p0"], ["d0"])])
        async with running_router(write_table(tmp_path / "routing.json", t), health_interval=30.0) as r:
            async with aiohttp.ClientSession() as s:
                first = asyncio.ensure_future(post(s, r.url + "/v1/completions", BODY))
                while p0.inflight == 0:  # a condition, not a timing assertion
                    await asyncio.sleep(0.01)
                # the decode has seen nothing yet, but its one place is taken by the request in prefill
                assert r.table.replicas["d0"].inflight == 1 and not d0.records
                status, body, h = await post(s, r.url + "/v1/completions", BODY)
                assert status == 429 and body["error"]["type"] == "RateLimitError" and h["Retry-After"] == "1"
                p0.b.hold.set()
                status, _, h = await first
                assert status == 200 and h["X-Hetcompile-Replica"] == "d0"
            assert len(p0.records) == 1 and r.metrics.rejected.get(("tiny", "default")) == 1
            assert r.table.replicas["d0"].inflight == 0 and r.table.groups["g"].inflight == 0
    finally:
        await stop_all(fs)


async def test_metrics_show_each_phase_and_keep_the_existing_series(tmp_path):
    fs = await fakes(("p0", "prefill"), ("d0", "decode"))
    p0, d0 = fs
    try:
        t = pd_table({"p0": p0.url}, {"d0": d0.url})
        async with running_router(write_table(tmp_path / "routing.json", t), health_interval=30.0) as r:
            async with aiohttp.ClientSession() as s:
                for _ in range(2):
                    status, _, _ = await post(s, r.url + "/v1/completions", BODY)
                    assert status == 200
                async with s.get(r.url + "/metrics") as resp:
                    text = await resp.text()
                async with s.get(r.url + "/admin/status") as resp:
                    st = await resp.json()
        types = check_exposition(text)
        assert types["hetcompile_router_pd_phase_duration_seconds"] == "histogram"
        assert 'hetcompile_router_pd_phase_duration_seconds_count{group="g",role="prefill"} 2' in text
        assert 'hetcompile_router_pd_phase_duration_seconds_count{group="g",role="decode"} 2' in text
        assert 'hetcompile_router_pd_attempts_total{group="g",role="decode",result="ok"} 2' in text
        assert 'hetcompile_router_replica_role{replica="p0",role="prefill"} 1' in text
        assert 'hetcompile_router_replica_role{replica="d0",role="decode"} 1' in text
        # the series that were there before keep their names and labels
        assert 'hetcompile_router_requests_total{model="tiny",class="default",code="200"} 2' in text
        assert 'hetcompile_router_policy_choices_total{policy="weighted",replica="g"} 2' in text
        assert 'hetcompile_router_policy_choices_total{policy="weighted",replica="p0"} 2' in text
        assert 'hetcompile_router_upstream_first_byte_seconds_count{replica="d0"} 2' in text
        assert 'hetcompile_router_inflight_requests{replica="p0"} 0' in text
        assert st["groups"]["g"]["prefill"] == ["p0"] and st["groups"]["g"]["decode"] == ["d0"]
        assert st["replicas"]["p0"]["role"] == "prefill"
    finally:
        await stop_all(fs)


@pytest.mark.parametrize("policy", ["weighted", "kv-aware", "min-max", "round-robin", "least-outstanding"])
def test_every_policy_chooses_among_groups_and_replicas(policy):
    d = pd_table({"p0": "http://127.0.0.1:1"}, {"d0": "http://127.0.0.1:2", "d1": "http://127.0.0.1:4"},
                 others={"a": "http://127.0.0.1:3"}, weights={"g": 0.5, "a": 0.5})
    t = compile_table(RoutingTable.model_validate(d), policy_override=policy)
    picker = t.models["tiny"].classes[0].picker
    g = t.groups["g"]
    assert g.policy == policy and g.decode_tps == 2_000.0
    seen = set()
    for _ in range(4):
        r, cost, _ = picker.choose(150.0, 100.0, 50.0, None, bounded=True)
        seen.add(r.id)
        r.acquire(150.0, cost)  # held: least-outstanding and min-max then prefer the other
    # both kinds of candidate are chosen (min-max gives the group, with twice a's decode throughput, more)
    assert seen == {"a", "g"} and g.inflight + t.replicas["a"].inflight == 4


def test_group_kv_face_is_its_roomiest_decode_replica():
    d = pd_table({"p0": "http://127.0.0.1:1"}, {"d0": "http://127.0.0.1:2", "d1": "http://127.0.0.1:4"},
                 kv_capacity_tokens=1000)
    t = compile_table(RoutingTable.model_validate(d), high_water=0.95)
    g, d0, d1 = t.groups["g"], t.replicas["d0"], t.replicas["d1"]
    d0.acquire(900.0, 0.0)
    d1.acquire(300.0, 0.0)
    assert g.kv_usage() == pytest.approx(0.3) and g.kv_capacity == 1000 and not g.blocked()
    d1.obs_waiting = 2.0  # vLLM queues on d1 and nothing finished since: only d0 is open
    assert g.kv_usage() == pytest.approx(0.9) and not g.blocked()
    d0.obs_waiting = 1.0
    assert g.blocked()
    # kv-aware masks the group exactly when its decode picker would find every decode masked
    d0.obs_waiting = d1.obs_waiting = None
    kv = compile_table(RoutingTable.model_validate(d), t.replicas, previous_groups=t.groups, policy_override="kv-aware")
    picker = kv.models["tiny"].classes[0].picker
    assert picker.choose(600.0, 500.0, 100.0, None) == (g, 0.0, False)  # fits d1 (0.3 + 0.6 <= 0.95)
    assert picker.choose(700.0, 600.0, 100.0, None) == (g, 0.0, True)  # fits neither: overflow


async def test_a_prefill_answer_that_is_not_json_is_retried_elsewhere(tmp_path):
    async def garbage(_request):
        return web.Response(text="<html>busy</html>", content_type="text/html")

    async def ok(_request):
        return web.Response()

    app = web.Application()
    app.router.add_post("/v1/completions", garbage)
    app.router.add_get("/health", ok)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    bad_url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    fs = await fakes(("p1", "prefill"), ("d0", "decode"))
    p1, d0 = fs
    try:
        t = pd_table({"p0": bad_url, "p1": p1.url}, {"d0": d0.url})
        async with running_router(write_table(tmp_path / "routing.json", t), health_interval=30.0) as r:
            async with aiohttp.ClientSession() as s:
                status, _, h = await post(s, r.url + "/v1/completions", BODY)
            assert status == 200 and h["X-Hetcompile-Replica"] == "d0" and len(p1.kv_handed) == 1
            assert r.metrics.errors.get(("prefill_bad_answer",)) == 1 and r.metrics.retries.get(("p0",)) == 1
    finally:
        await stop_all(fs)
        await runner.cleanup()
