"""The hot-path HTTP/1.1 client: framing, pooling, timeouts, against scripted servers on 127.0.0.1."""

from __future__ import annotations

import asyncio
import random

import pytest

from hetcompile.router.upstream import (
    ConnectError,
    ConnectionLost,
    ProtocolError,
    ReadTimeout,
    Response,
    UpstreamPool,
    parse_endpoint,
)


class _FakeConn:
    def __init__(self):
        self.transport = None
        self.closed = False
        self.pool = None

    def close(self):
        self.closed = True


def feed_all(pieces: list[bytes]) -> Response:
    r = Response(_FakeConn(), None, None)
    for p in pieces:
        r._feed(p)
    return r


def random_split(data: bytes, rng: random.Random) -> list[bytes]:
    cuts = sorted(rng.sample(range(1, len(data)), k=min(len(data) - 1, rng.randint(1, 12))))
    return [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)])]


CHUNKED = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
    b"b\r\ndata: one\n\n\r\n"
    b"B;ext=1\r\ndata: two\n\n\r\n"
    b"0\r\nX-Trailer: t\r\n\r\n"
)


def test_chunked_parse_any_split():
    rng = random.Random(3)
    for _ in range(300):
        r = feed_all(random_split(CHUNKED, rng))
        assert r._done and r._exc is None and r._keep_alive
        assert r.status == 200 and r.headers["content-type"] == "text/event-stream"
        assert b"".join(r._parts) == b"data: one\n\ndata: two\n\n"


def test_content_length_interim_and_close_semantics():
    r = feed_all([b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 201 Created\r\nContent-Length: 5\r\n\r\nhello"])
    assert (r.status, b"".join(r._parts), r._done) == (201, b"hello", True)
    r = feed_all([b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"])
    assert r._done and not r._keep_alive
    r = feed_all([b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok"])
    assert r._done and not r._keep_alive  # HTTP/1.0 without keep-alive
    r = feed_all([b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nokEXTRA"])
    assert r._done and not r._keep_alive  # bytes beyond the message: never reuse
    r = feed_all([b"HTTP/1.1 204 No Content\r\n\r\n"])
    assert r._done


@pytest.mark.parametrize(
    "raw",
    [b"SPAM 200 OK\r\n\r\n", b"HTTP/1.1 abc OK\r\n\r\n", b"HTTP/1.1 200 OK\r\nno colon\r\n\r\n",
     b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n"],
)  # fmt: skip
def test_protocol_errors(raw):
    r = feed_all([raw])
    assert isinstance(r._exc, ProtocolError)


def test_parse_endpoint():
    assert parse_endpoint("http://10.0.0.1:8000") == (("10.0.0.1", 8000, False), b"10.0.0.1:8000", b"")
    assert parse_endpoint("https://h.example/v/") == (("h.example", 443, True), b"h.example", b"/v")
    assert parse_endpoint("http://[::1]:8000")[1] == b"[::1]:8000"
    with pytest.raises(ValueError):
        parse_endpoint("10.0.0.1:8000")


# -- against real sockets ---------------------------------------------------------------------


class Scripted:
    """A server on 127.0.0.1 that answers each request with the next script entry.

    An entry is a list of byte strings written with a pause between them; `None` closes the
    connection; "hang" never answers; "close-after" answers then closes.
    """

    def __init__(self, script):
        self.script = list(script)
        self.connections = 0
        self.requests: list[bytes] = []
        self.tasks: list[asyncio.Task] = []
        self.server = None

    async def __aenter__(self):
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.key = ("127.0.0.1", self.server.sockets[0].getsockname()[1], False)
        return self

    async def __aexit__(self, *exc):
        self.server.close()
        for t in self.tasks:
            t.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        await self.server.wait_closed()

    async def _handle(self, reader, writer):
        self.tasks.append(asyncio.current_task())
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                n = int([l for l in head.split(b"\r\n") if l.lower().startswith(b"content-length")][0].split(b":")[1])
                self.requests.append(head + await reader.readexactly(n))
                step = self.script.pop(0)
                if step == "hang":
                    await asyncio.sleep(3600)
                close_after = isinstance(step, tuple)
                for piece in step[0] if close_after else step:
                    writer.write(piece)
                    await writer.drain()
                    await asyncio.sleep(0.001)
                if close_after:
                    break
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            pass  # a cancelled handler that re-raised would be logged by asyncio's streams
        finally:
            writer.close()


def req(key) -> bytes:
    return b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n"


OK = [b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n", b"hel", b"lo"]


async def test_keepalive_reuses_one_connection():
    async with Scripted([OK, OK, OK]) as s:
        pool = UpstreamPool(connect_timeout=1, read_timeout=2, keepalive=10)
        for _ in range(3):
            r = await pool.request(s.key, req(s.key), b"{}")
            assert await r.read() == b"hello"
            r.release()
        assert s.connections == 1
        assert s.requests[0].endswith(b"\r\n\r\n{}")
        pool.close()


async def test_stream_readany_delivers_pieces_as_they_come():
    script = [[b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n", b"3\r\nabc\r\n", b"2\r\nde\r\n", b"0\r\n\r\n"]]
    async with Scripted(script) as s:
        pool = UpstreamPool(connect_timeout=1, read_timeout=2, keepalive=10)
        r = await pool.request(s.key, req(s.key), b"{}")
        got = []
        while chunk := await r.readany():
            got.append(chunk)
        assert b"".join(got) == b"abcde" and len(got) >= 2
        r.release()
        pool.close()


async def test_stale_pooled_connection_is_retried_transparently():
    async with Scripted([(OK,), OK]) as s:  # the server closes after the first answer
        pool = UpstreamPool(connect_timeout=1, read_timeout=2, keepalive=10)
        r = await pool.request(s.key, req(s.key), b"{}")
        assert await r.read() == b"hello"
        r.release()
        await asyncio.sleep(0.05)
        r = await pool.request(s.key, req(s.key), b"{}")
        assert await r.read() == b"hello"
        r.release()
        assert s.connections == 2
        pool.close()


async def test_connection_close_header_is_honoured():
    close = [b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok"]
    async with Scripted([close, close]) as s:
        pool = UpstreamPool(connect_timeout=1, read_timeout=2, keepalive=10)
        for _ in range(2):
            r = await pool.request(s.key, req(s.key), b"{}")
            assert await r.read() == b"ok"
            r.release()
        assert s.connections == 2
        pool.close()


async def test_read_timeout_and_lost_connection_and_refused():
    async with Scripted(["hang", ([b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort"],)]) as s:
        pool = UpstreamPool(connect_timeout=1, read_timeout=0.2, keepalive=10)
        with pytest.raises(ReadTimeout):
            await pool.request(s.key, req(s.key), b"{}")
        r = await pool.request(s.key, req(s.key), b"{}")
        with pytest.raises(ConnectionLost):
            await r.read()
        r.release()
        port = s.key[1]
    with pytest.raises(ConnectError):
        await pool.request(("127.0.0.1", port, False), req(None), b"{}")
    pool.close()


async def test_connect_storm_is_capped_and_fails_fast_behind_a_dead_host():
    with __import__("socket").socket() as sk:
        sk.bind(("127.0.0.1", 0))
        dead = ("127.0.0.1", sk.getsockname()[1], False)
    pool = UpstreamPool(connect_timeout=1, read_timeout=2, keepalive=10, max_connecting=2)
    attempts = 0
    connect = pool._connect

    async def counting(key):
        nonlocal attempts
        attempts += 1
        return await connect(key)

    pool._connect = counting
    res = await asyncio.gather(*(pool.request(dead, req(dead), b"{}") for _ in range(50)), return_exceptions=True)
    assert all(isinstance(e, ConnectError) for e in res)
    assert attempts < 10  # the queue behind a failed connect fails without its own attempt

    async with Scripted([OK] * 200) as s:
        pool = UpstreamPool(connect_timeout=1, read_timeout=2, keepalive=10, max_connecting=4)

        async def one():
            r = await pool.request(s.key, req(s.key), b"{}")
            body = await r.read()
            r.release()
            return body

        assert await asyncio.gather(*(one() for _ in range(200))) == [b"hello"] * 200
        assert s.connections <= 200  # some requests reused connections freed while they queued
        pool.close()


class _ClosedUnderUs:
    """A transport that uvloop reports as open but refuses writes on, as after a peer reset."""

    def __init__(self, real):
        self.real = real

    def is_closing(self):
        return False

    def write(self, data):
        raise RuntimeError("unable to perform operation on <TCPTransport closed=True>; the handler is closed")

    writelines = write

    def __getattr__(self, name):
        return getattr(self.real, name)


async def test_write_on_a_closed_pooled_transport_is_retried_on_a_fresh_connection():
    async with Scripted([OK, OK]) as s:
        pool = UpstreamPool(connect_timeout=1, read_timeout=2, keepalive=10)
        r = await pool.request(s.key, req(s.key), b"{}")
        assert await r.read() == b"hello"
        r.release()
        conn = pool.idle[s.key][0]
        conn.transport = _ClosedUnderUs(conn.transport)
        r = await pool.request(s.key, req(s.key), b"{}")
        assert await r.read() == b"hello"
        r.release()
        assert s.connections == 2
        pool.close()
