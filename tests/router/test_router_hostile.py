"""Hostile and malformed client bodies and routing tables (issue 23, item 5).

Every body the router cannot use answers 400 (413 past `max_body_bytes`) with an OpenAI error
object and never reaches a replica; a bad table on reload answers 400 with the reason and the
old table keeps serving. The cases the issue found answering 500 are here by name.
"""

from __future__ import annotations

import gzip
import json

import aiohttp
import pytest

from hetcompile.router.classify import MAX_JSON_INT, BadRequest, parse_request
from hetcompile.router.table import RouterError, load_table

from .fake_vllm import FakeVllm
from .util import klass, post, replica, running_router, table, write_table

DEEP = 100_000  # the nesting depth: RecursionError in json.loads, a 500 before


def assert_openai_error(status: int, body: object, want_status: int, param: str | None = None) -> None:
    """`body` is {"error": {"message", "type": "invalid_request_error", "param", "code"}}."""
    assert status == want_status, body
    assert isinstance(body, dict) and set(body) == {"error"}, body
    err = body["error"]
    assert set(err) == {"message", "type", "param", "code"}, err
    assert isinstance(err["message"], str) and err["message"]
    assert err["type"] == "invalid_request_error" and err["code"] == want_status and err["param"] == param


# -- parse_request, one field at a time ------------------------------------------------------

# (path is chat, body, the `param` the error names); each is a 400
REFUSED = [
    (False, b"{not json", None),
    (False, b"", None),
    (False, b"[1, 2]", None),
    (False, b'"a string"', None),
    (False, b"null", None),
    (False, str(10**400).encode(), None),  # a huge number as the whole body
    (False, b"\xff\xfe{}", None),  # not UTF-8
    (False, '{"prompt": "x"}'.encode("utf-16"), None),  # JSON, but UTF-16 (RFC 8259 wants UTF-8)
    (False, b'{"prompt": "\xc3"}', None),  # a torn UTF-8 sequence
    (False, b'{"prompt": "\xed\xa0\x80"}', None),  # an encoded lone surrogate (json.loads(bytes) let it in)
    (False, b"[" * DEEP + b"]" * DEEP, None),
    (False, b'{"prompt": ' + b"[" * DEEP + b"]" * DEEP + b"}", None),
    (False, b'{"n": ' + b"9" * 5000 + b"}", None),  # past int()'s 4300-digit limit
    (False, b'{"model": 3}', "model"),
    (False, b'{"model": ["tiny"]}', "model"),
    (False, b'{"prompt": 12}', "prompt"),
    (False, b'{"prompt": {"text": "x"}}', "prompt"),
    (False, b'{"prompt": [1, "x"]}', "prompt"),
    (False, b'{"prompt": [[1, 2], "x"]}', "prompt"),
    (False, b'{"prompt": [true, false]}', "prompt"),
    (False, b'{"prompt": [[1.5]]}', "prompt"),
    (False, b'{"prompt": "x", "max_tokens": "16"}', "max_tokens"),
    (False, b'{"prompt": "x", "max_tokens": 1.5}', "max_tokens"),
    (False, b'{"prompt": "x", "max_tokens": true}', "max_tokens"),
    (False, b'{"prompt": "x", "max_tokens": NaN}', "max_tokens"),
    (False, b'{"prompt": "x", "max_tokens": Infinity}', "max_tokens"),
    (False, b'{"prompt": "x", "max_tokens": 1e999}', "max_tokens"),
    (False, b'{"prompt": "x", "n": ' + str(10**400).encode() + b"}", "n"),  # the OverflowError
    (False, b'{"prompt": "x", "n": ' + str(-(10**400)).encode() + b"}", "n"),
    (False, b'{"prompt": "x", "n": ' + str(MAX_JSON_INT + 1).encode() + b"}", "n"),
    (False, b'{"prompt": "x", "n": [2]}', "n"),
    (False, b'{"prompt": "x", "stream": "true"}', "stream"),
    (False, b'{"prompt": "x", "stream": 1}', "stream"),
    (True, b'{"messages": "hi"}', "messages"),
    (True, b'{"messages": {"role": "user"}}', "messages"),
    (True, b'{"messages": ["hi"]}', "messages"),
    (True, b'{"messages": [{"role": "user", "content": 5}]}', "messages"),
    (True, b'{"messages": [{"role": "user", "content": [1]}]}', "messages"),
    (True, b'{"messages": [], "max_completion_tokens": "8"}', "max_completion_tokens"),
    (True, b'{"messages": [], "max_completion_tokens": 8, "max_tokens": {}}', "max_tokens"),
]


@pytest.mark.parametrize("chat, body, param", REFUSED, ids=[f"{i}" for i in range(len(REFUSED))])
def test_unusable_bodies_are_refused_naming_the_field(chat, body, param):
    with pytest.raises(BadRequest) as e:
        parse_request(body, chat, 4.0)
    assert e.value.param == param
    assert str(e.value)


def test_what_the_openai_api_accepts_is_still_routed():
    # shapes a valid client sends, some of them unusual: routed, not refused
    assert parse_request(b'{"prompt": null}', False, 4.0).prompt_tokens == 0  # vLLM's prompt_embeds
    assert parse_request(b"{}", False, 4.0).n_seqs == 1
    assert parse_request(b"{}", True, 4.0).prompt_tokens == 0  # no messages: the replica's 400 to give
    assert parse_request(b'{"prompt": []}', False, 4.0).prompt_tokens == 0
    assert parse_request(b'{"prompt": [[1, 2], [3]], "n": 2}', False, 4.0).n_seqs == 4
    assert parse_request(b'{"prompt": "x", "max_tokens": 5.0}', False, 4.0).max_tokens == 5  # the same JSON number as 5
    assert parse_request(b'{"prompt": "x", "max_tokens": null, "n": null, "stream": null}', False, 4.0).max_tokens is None
    big = parse_request(b'{"prompt": "x", "n": %d, "max_tokens": %d}' % (MAX_JSON_INT, MAX_JSON_INT), False, 4.0)
    assert big.n_seqs == MAX_JSON_INT and big.max_tokens == MAX_JSON_INT
    assert parse_request(b"\xef\xbb\xbf" + b'{"prompt": "abcd"}', False, 4.0).prompt_tokens == 1  # a UTF-8 BOM, as before
    chat = b'{"messages": [{"role": "assistant", "content": null, "tool_calls": []}, {"role": "user", "content": ["ab", {"type": "text", "text": "cd"}]}]}'
    assert parse_request(chat, True, 1.0).prompt_tokens == 4
    deep_but_unread = b'{"prompt": "x", "extra": ' + b"[" * 500 + b"]" * 500 + b"}"  # within the parser's limit
    assert parse_request(deep_but_unread, False, 4.0).prompt_tokens == 0.25


# -- over HTTP -------------------------------------------------------------------------------


async def test_hostile_bodies_answer_400_and_never_reach_a_replica(tmp_path):
    async with FakeVllm("a") as a:
        async with running_router(write_table(tmp_path / "routing.json", table([replica("a", a.url)]))) as r:
            async with aiohttp.ClientSession() as s:
                for chat, body, param in REFUSED:
                    path = "/v1/chat/completions" if chat else "/v1/completions"
                    status, got, _ = await post(s, r.url + path, body)
                    assert_openai_error(status, got, 400, param)
                # the two 500s, by name
                status, got, _ = await post(s, r.url + "/v1/completions", {"model": "tiny", "prompt": "x", "n": 10**400})
                assert_openai_error(status, got, 400, "n")
                status, got, _ = await post(s, r.url + "/v1/chat/completions", b"[" * DEEP + b"]" * DEEP)
                assert_openai_error(status, got, 400)
                # a valid request still goes through, its bytes unchanged
                ok = b'{"model": "tiny", "prompt": "x",  "max_tokens": 2.0}'
                status, got, _ = await post(s, r.url + "/v1/completions", ok)
                assert status == 200 and got["usage"]["completion_tokens"] == 2
            assert [rec.body for rec in a.records] == [ok]
            assert r.metrics.errors.values[("bad_request",)] == len(REFUSED) + 2


async def test_a_body_that_does_not_decompress_is_400(tmp_path, caplog):
    # aiohttp inflates Content-Encoding bodies; a broken one raised out of request.read() (500)
    async with FakeVllm("a") as a:
        async with running_router(write_table(tmp_path / "routing.json", table([replica("a", a.url)]))) as r:
            async with aiohttp.ClientSession() as s:
                hd = {"Content-Encoding": "gzip"}
                status, got, _ = await post(s, r.url + "/v1/completions", b"\x1f\x8b not gzip at all", headers=hd)
                assert_openai_error(status, got, 400)
                assert "gzip" in got["error"]["message"]
                good = gzip.compress(json.dumps({"model": "tiny", "prompt": "x", "max_tokens": 1}).encode())
                status, got, _ = await post(s, r.url + "/v1/completions", good, headers=hd)
                assert status == 200
            assert len(a.records) == 1
    # nor does the broken rest of the body come back as an unhandled exception in the log
    assert [rec.getMessage() for rec in caplog.records if rec.levelname == "ERROR"] == []


async def test_oversize_bodies_are_413_with_an_openai_error(tmp_path):
    async with FakeVllm("a") as a:
        async with running_router(write_table(tmp_path / "routing.json", table([replica("a", a.url)])), max_body_bytes=4096) as r:
            async with aiohttp.ClientSession() as s:
                status, got, _ = await post(s, r.url + "/v1/completions", {"model": "tiny", "prompt": "x" * 5000})
                assert_openai_error(status, got, 413)

                async def chunks():  # no Content-Length: the limit holds for a chunked body too
                    for _ in range(10):
                        yield b" " * 1000

                async with s.post(r.url + "/v1/completions", data=chunks()) as resp:
                    assert_openai_error(resp.status, await resp.json(), 413)
                status, _, _ = await post(s, r.url + "/v1/completions", {"model": "tiny", "prompt": "x" * 3000})
                assert status == 200
            assert len(a.records) == 1


# -- bad tables on reload --------------------------------------------------------------------


def _bad_tables(good: dict) -> dict[str, bytes]:
    """Named replacements for a good table, each one the reload must refuse."""

    def with_(**kw) -> bytes:
        return json.dumps({**good, **kw}).encode()

    neg = json.loads(json.dumps(good))
    neg["models"][0]["classes"][0]["weights"][0]["weight"] = -1.0
    huge = json.loads(json.dumps(good))
    huge["replicas"][0]["kv_capacity_tokens"] = 10**400
    inf = json.loads(json.dumps(good))
    inf["replicas"][0]["decode_tokens_per_s"] = float("inf")
    nan_w = json.loads(json.dumps(good))
    nan_w["models"][0]["classes"][0]["weights"][0]["weight"] = float("nan")
    dangling = json.loads(json.dumps(good))
    dangling["models"][0]["classes"][0]["weights"][0]["replica"] = "ghost"
    return {
        "binary": bytes(range(256)) * 4,
        "empty": b"",
        "not json": b"{plan: test",
        "json list": b"[]",
        "deep": b"[" * DEEP + b"]" * DEEP,
        "unknown policy": with_(policy="fastest"),
        "unknown key": with_(extra=1),
        "missing replicas": json.dumps({k: v for k, v in good.items() if k != "replicas"}).encode(),
        "negative weight": json.dumps(neg).encode(),
        "nan weight": json.dumps(nan_w).encode(),
        "weight to unknown replica": json.dumps(dangling).encode(),
        "int past 2**53": json.dumps(huge).encode(),
        "infinite throughput": json.dumps(inf).encode(),
        "zero chars_per_token": with_(chars_per_token=0),
        "version 2": with_(version=2),
    }


async def test_a_bad_table_on_reload_is_400_and_the_old_one_keeps_serving(tmp_path):
    async with FakeVllm("a") as a:
        good = table([replica("a", a.url)], models={"tiny": [klass("default", {"a": 1.0})]})
        path = write_table(tmp_path / "routing.json", good)
        async with running_router(path) as r:
            async with aiohttp.ClientSession() as s:
                bad = _bad_tables(good)
                for name, data in bad.items():
                    path.write_bytes(data)
                    async with s.post(r.url + "/admin/reload") as resp:
                        got = await resp.json()
                        assert_openai_error(resp.status, got, 400)
                    assert str(path) in got["error"]["message"], name
                    status, _, hd = await post(s, r.url + "/v1/completions", {"model": "tiny", "prompt": "x", "max_tokens": 1})
                    assert status == 200 and hd["X-Hetcompile-Replica"] == "a", name
                write_table(path, good)
                async with s.post(r.url + "/admin/reload") as resp:
                    assert resp.status == 200
            assert r.metrics.reloads.values == {("error",): len(bad), ("ok",): 1}


def test_load_table_names_what_is_wrong(tmp_path):
    good = table([replica("a", "http://127.0.0.1:1")])
    bad = _bad_tables(good)
    path = tmp_path / "routing.json"
    reasons = {
        "binary": "not UTF-8",
        "deep": "recursion limit",
        "unknown policy": "policy",
        "negative weight": "greater than or equal to 0",
        "weight to unknown replica": "unknown replica 'ghost'",
        "int past 2**53": "replicas[0].kv_capacity_tokens must be at most",
        "infinite throughput": "replicas[0].decode_tokens_per_s must be a finite number",
    }
    for name, want in reasons.items():
        path.write_bytes(bad[name])
        with pytest.raises(RouterError, match="invalid routing table") as e:
            load_table(path)
        assert want in str(e.value), (name, str(e.value))


async def _raw(url: str, data: bytes) -> tuple[int, dict]:
    """Send `data` as is on a new connection; the status and the JSON body of the answer."""
    import asyncio
    from urllib.parse import urlsplit

    u = urlsplit(url)
    reader, writer = await asyncio.open_connection(u.hostname, u.port)
    writer.write(data)
    await writer.drain()
    raw = await asyncio.wait_for(reader.read(), 30)
    writer.close()
    head, _, body = raw.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    assert b"application/json" in head.lower(), head
    return status, json.loads(body)


MALFORMED = [
    # broken chunked framing: a chunk size that is not hex
    b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nabc\r\n0\r\n\r\n",
    # both Content-Length and chunked (request smuggling shape)
    b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
    # a Content-Encoding nobody supports
    b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Encoding: x-nonsense\r\nContent-Length: 2\r\n\r\n{}",
    # a header line without a colon
    b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nthis is not a header\r\nContent-Length: 2\r\n\r\n{}",
]


@pytest.mark.parametrize("data", MALFORMED)
async def test_malformed_http_gets_the_routers_openai_error_body(tmp_path, data):
    """What aiohttp answers itself (it cannot parse the request) has the body of the router's own
    400s: an OpenAI error object, not aiohttp's plain text."""
    async with FakeVllm("a") as a:
        async with running_router(write_table(tmp_path / "routing.json", table([replica("a", a.url)]))) as r:
            status, got = await _raw(r.url, data)
            assert_openai_error(status, got, 415 if b"x-nonsense" in data else 400)
            assert got["error"]["message"].startswith("malformed HTTP request")
        assert a.records == []
