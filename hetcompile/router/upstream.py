"""A lean HTTP/1.1 client for the proxy hot path: pooled keep-alive connections to replicas.

Why not aiohttp.ClientSession here: measured on the project machine (2 cores, uvloop, small
JSON bodies), aiohttp's client spends about 160 µs of CPU per request, a bare asyncio protocol
about 25 µs, and the aiohttp server side about 70 µs. With aiohttp's client the router was
CPU-bound near 4,000 req/s; the target is 5,000. Health polling (a few requests a second) still
uses aiohttp's client.

What it speaks, and all the proxy needs: one request at a time per connection (no pipelining);
responses framed by Content-Length, `Transfer-Encoding: chunked` (vLLM's streams) or
connection close; 1xx interim responses skipped; `Connection: close` and HTTP/1.0 honoured;
http and https. Bodies are delivered as they arrive (`readany`) or whole (`read`); reading is
paused while more than `_HIGH_WATER` bytes wait for a slow consumer (backpressure).

Timeouts: `connect_timeout` for the TCP (and TLS) connect, `read_timeout` for any single wait
on the replica (first byte or next byte). A timed-out or half-read response closes its
connection, which is also how a cancelled request is aborted in vLLM.

A pooled connection that the replica closed while idle fails the next request without a byte
of answer; that request is re-sent once on a fresh connection (what browsers and urllib3 do)
so a stale socket is never mistaken for a failing replica. Idle connections are dropped after
`keepalive` seconds, before uvicorn's own 5 s keep-alive timeout closes them.

Connection storms: at most `max_connecting` connects per replica are under way at once; other
requests queue for a slot, and take a pooled connection instead if one is freed meanwhile. A
burst of thousands of requests thus ramps the pool up instead of overflowing the replica's
listen backlog (whose dropped SYNs would look like connect timeouts). When a connect fails,
the requests that were queued behind it fail at once (they retry on another replica) instead
of each waiting out its own timeout against a dead host.
"""

from __future__ import annotations

import asyncio
import ssl as _ssl
import time
from urllib.parse import urlsplit

_MAX_HEAD = 64 * 1024
_HIGH_WATER = 1 << 20

# parser states
_HEAD, _LENGTH, _CHUNK_SIZE, _CHUNK_DATA, _CHUNK_CRLF, _TRAILERS, _UNTIL_CLOSE, _DONE = range(8)


class UpstreamError(Exception):
    """The replica could not be reached or did not answer properly."""


class ConnectError(UpstreamError):
    pass


class ReadTimeout(UpstreamError):
    pass


class ProtocolError(UpstreamError):
    pass


class ConnectionLost(UpstreamError):
    pass


ConnKey = tuple[str, int, bool]


def parse_endpoint(endpoint: str) -> tuple[ConnKey, bytes, bytes]:
    """(connection key (host, port, tls), Host header value, base path) of a replica URL."""
    u = urlsplit(endpoint)
    if u.scheme not in ("http", "https") or not u.hostname:
        raise ValueError(f"endpoint {endpoint!r} is not an http(s) URL with a host")
    tls = u.scheme == "https"
    port = u.port or (443 if tls else 80)
    host = u.hostname
    host_header = f"[{host}]" if ":" in host else host
    if u.port is not None:
        host_header += f":{port}"
    return (host, port, tls), host_header.encode("idna"), u.path.rstrip("/").encode()


class _Conn(asyncio.Protocol):
    __slots__ = ("key", "pool", "transport", "resp", "closed", "idle_since")

    def __init__(self, key: ConnKey, pool: "UpstreamPool"):
        self.key = key
        self.pool = pool
        self.transport: asyncio.Transport | None = None
        self.resp: Response | None = None
        self.closed = False
        self.idle_since = 0.0

    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        r = self.resp
        if r is None:
            # bytes on an idle connection: the stream is out of step, never reuse it
            self.close()
            return
        r._feed(data)

    def eof_received(self):
        return False  # close our side too

    def connection_lost(self, exc) -> None:
        self.closed = True
        if self.resp is not None:
            self.resp._lost(exc)

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()


class Response:
    """One response. Use `read()` or `readany()`, then always `release()` (or `close()`)."""

    __slots__ = (
        "_conn", "_loop", "_timeout", "status", "headers", "_buf", "_state", "_remaining",
        "_parts", "_buffered", "_paused", "_head_done", "_done", "_exc", "_waiter",
        "_keep_alive", "_chunked", "_got_bytes", "_released",
    )  # fmt: skip

    def __init__(self, conn: _Conn, loop: asyncio.AbstractEventLoop, timeout: float | None):
        self._conn = conn
        self._loop = loop
        self._timeout = timeout
        self.status = 0
        self.headers: dict[str, str] = {}
        self._buf = bytearray()
        self._state = _HEAD
        self._remaining = 0
        self._parts: list[bytes] = []
        self._buffered = 0
        self._paused = False
        self._head_done = False
        self._done = False
        self._exc: BaseException | None = None
        self._waiter: asyncio.Future | None = None
        self._keep_alive = True
        self._chunked = False
        self._got_bytes = False
        self._released = False

    # -- fed by the protocol -----------------------------------------------------------------

    def _feed(self, data: bytes) -> None:
        self._got_bytes = True
        self._buf += data
        try:
            self._parse()
        except ProtocolError as e:
            self._fail(e)
            return
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)

    def _lost(self, exc: BaseException | None) -> None:
        if self._state == _UNTIL_CLOSE:
            if self._buf:
                self._push(bytes(self._buf))
                self._buf.clear()
            self._state = _DONE
            self._done = True
            self._keep_alive = False
            w = self._waiter
            if w is not None and not w.done():
                w.set_result(None)
        elif not self._done:
            self._fail(ConnectionLost(f"connection lost before the response completed ({exc or 'closed by peer'})"))

    def _fail(self, exc: BaseException) -> None:
        if self._exc is None and not self._done:
            self._exc = exc
        self._keep_alive = False
        self._conn.close()
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)

    def _push(self, part: bytes) -> None:
        self._parts.append(part)
        self._buffered += len(part)
        if self._buffered > _HIGH_WATER and not self._paused and self._conn.transport is not None:
            self._paused = True
            self._conn.transport.pause_reading()

    def _parse_head(self, head: bytes) -> None:
        lines = head.split(b"\r\n")
        status_line = lines[0]
        parts = status_line.split(b" ", 2)
        if len(parts) < 2 or not parts[0].startswith(b"HTTP/1."):
            raise ProtocolError(f"bad status line {status_line[:80]!r}")
        try:
            self.status = int(parts[1])
        except ValueError:
            raise ProtocolError(f"bad status line {status_line[:80]!r}") from None
        http10 = parts[0] == b"HTTP/1.0"
        headers: dict[str, str] = {}
        for line in lines[1:]:
            k, sep, v = line.partition(b":")
            if not sep:
                raise ProtocolError(f"bad header line {line[:80]!r}")
            headers[k.strip().lower().decode("latin-1")] = v.strip().decode("latin-1")
        self.headers = headers
        conn = headers.get("connection", "").lower()
        self._keep_alive = ("keep-alive" in conn) if http10 else ("close" not in conn)

    def _parse(self) -> None:
        """Consume what the buffer holds, one state of the response at a time: each state's step
        returns True to go on with the next state, False when it needs more bytes (or is done)."""
        steps = self._STEPS
        while steps[self._state](self, self._buf):
            pass

    def _head(self, buf: bytearray) -> bool:
        i = buf.find(b"\r\n\r\n")
        if i < 0:
            if len(buf) > _MAX_HEAD:
                raise ProtocolError("response head too large")
            return False
        head = bytes(buf[:i])
        del buf[: i + 4]
        self._parse_head(head)
        s = self.status
        if 100 <= s < 200:
            return True  # interim response: the real one follows
        self._head_done = True
        self._state = self._body_state(s, self.headers)
        return True

    def _body_state(self, status: int, h: dict[str, str]) -> int:
        """How the body is framed (RFC 9112 6.3): none, chunked, a Content-Length, or until close."""
        te = h.get("transfer-encoding")
        if status in (204, 304):
            return _DONE
        if te is not None and te.lower().rstrip().endswith("chunked"):
            self._chunked = True
            return _CHUNK_SIZE
        if "content-length" in h:
            try:
                n = int(h["content-length"])
            except ValueError:
                raise ProtocolError("bad Content-Length") from None
            if n < 0:
                raise ProtocolError("bad Content-Length")
            self._remaining = n
            return _LENGTH if n else _DONE
        self._keep_alive = False
        return _UNTIL_CLOSE

    def _take(self, buf: bytearray, then: int) -> bool:
        """Pass on up to `_remaining` body bytes, and go on to state `then` once they are all in;
        False when the buffer is empty (more bytes needed)."""
        if not buf:
            return False
        n = self._remaining
        if len(buf) <= n:
            part = bytes(buf)
            buf.clear()
        else:
            part = bytes(buf[:n])
            del buf[:n]
        self._remaining = n - len(part)
        self._push(part)
        if self._remaining == 0:
            self._state = then
        return True

    def _length(self, buf: bytearray) -> bool:
        return self._take(buf, _DONE)

    def _chunk_size(self, buf: bytearray) -> bool:
        i = buf.find(b"\r\n")
        if i < 0:
            if len(buf) > 4096:
                raise ProtocolError("chunk size line too long")
            return False
        line = bytes(buf[:i]).split(b";", 1)[0].strip()
        del buf[: i + 2]
        try:
            size = int(line, 16)
        except ValueError:
            raise ProtocolError(f"bad chunk size {line[:20]!r}") from None
        if size < 0:
            raise ProtocolError("bad chunk size")
        if size == 0:
            self._state = _TRAILERS
        else:
            self._remaining = size
            self._state = _CHUNK_DATA
        return True

    def _chunk_data(self, buf: bytearray) -> bool:
        return self._take(buf, _CHUNK_CRLF)

    def _chunk_crlf(self, buf: bytearray) -> bool:
        if len(buf) < 2:
            return False
        if buf[:2] != b"\r\n":
            raise ProtocolError("missing CRLF after chunk")
        del buf[:2]
        self._state = _CHUNK_SIZE
        return True

    def _trailers(self, buf: bytearray) -> bool:
        i = buf.find(b"\r\n")
        if i < 0:
            if len(buf) > _MAX_HEAD:
                raise ProtocolError("trailers too large")
            return False
        empty = i == 0
        del buf[: i + 2]
        if empty:
            self._state = _DONE
        return True

    def _until_close(self, buf: bytearray) -> bool:
        if buf:
            self._push(bytes(buf))
            buf.clear()
        return False

    def _finished(self, buf: bytearray) -> bool:
        self._done = True
        if buf:
            # bytes beyond the message: the connection is out of step
            self._keep_alive = False
            buf.clear()
        return False

    # one step per state, indexed by the state's number (_HEAD .. _DONE)
    _STEPS = (_head, _length, _chunk_size, _chunk_data, _chunk_crlf, _trailers, _until_close, _finished)

    # -- consumer side -----------------------------------------------------------------------

    async def _wait(self) -> None:
        fut = self._loop.create_future()
        self._waiter = fut
        h = self._loop.call_later(self._timeout, self._on_timeout) if self._timeout else None
        try:
            await fut
        finally:
            self._waiter = None
            if h is not None:
                h.cancel()

    def set_timeout(self, timeout: float | None) -> None:
        """The limit on each wait from now on (the proxy shortens it until the first byte)."""
        self._timeout = timeout

    def _on_timeout(self) -> None:
        self._fail(ReadTimeout(f"no data from the replica for {self._timeout:g} s"))

    async def start(self) -> None:
        """Wait for the status line and headers."""
        while not self._head_done:
            if self._exc is not None:
                raise self._exc
            await self._wait()

    async def read(self) -> bytes:
        """The whole body."""
        while not self._done:
            if self._exc is not None:
                raise self._exc
            if self._paused:
                self._resume()
            await self._wait()
        parts = self._parts
        self._parts = []
        self._buffered = 0
        return parts[0] if len(parts) == 1 else b"".join(parts)

    async def readany(self) -> bytes:
        """The body bytes that arrived since the last call; b"" at the end."""
        while not self._parts:
            if self._done:
                return b""
            if self._exc is not None:
                raise self._exc
            await self._wait()
        parts = self._parts
        self._parts = []
        self._buffered = 0
        if self._paused:
            self._resume()
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def _resume(self) -> None:
        """Lift the pause of a full buffer (only ever set with a transport: see the pause)."""
        self._paused = False
        if (t := self._conn.transport) is not None:
            t.resume_reading()

    def release(self) -> None:
        """Done with it: a complete keep-alive response returns its connection to the pool."""
        if self._released:
            return
        self._released = True
        conn = self._conn
        conn.resp = None
        if self._done and self._keep_alive and self._exc is None and not conn.closed:
            if self._paused:
                self._resume()
            conn.pool._put(conn)
        else:
            conn.close()

    def close(self) -> None:
        """Abandon the response and its connection (aborts the request upstream)."""
        self._released = True
        self._conn.resp = None
        self._conn.close()


class _Host:
    __slots__ = ("slots", "failed_at", "error")

    def __init__(self, max_connecting: int):
        self.slots = asyncio.Semaphore(max_connecting)
        self.failed_at = 0.0
        self.error = ""


class UpstreamPool:
    """Keep-alive connections per (host, port, tls), most recently used first."""

    def __init__(
        self,
        *,
        connect_timeout: float,
        read_timeout: float | None,
        keepalive: float,
        max_idle_per_host: int = 1024,
        max_connecting: int = 64,
    ):
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout
        self.keepalive = keepalive
        self.max_idle = max_idle_per_host
        self.max_connecting = max_connecting
        self.idle: dict[ConnKey, list[_Conn]] = {}
        self.hosts: dict[ConnKey, _Host] = {}
        self._ssl: _ssl.SSLContext | None = None
        self._closed = False

    def _take_idle(self, key: ConnKey, now: float) -> _Conn | None:
        lst = self.idle.get(key)
        while lst:
            c = lst.pop()
            if c.closed or c.transport is None or c.transport.is_closing():
                continue
            if now - c.idle_since > self.keepalive:
                c.close()
                continue
            return c
        return None

    def _put(self, conn: _Conn) -> None:
        lst = self.idle.setdefault(conn.key, [])
        if self._closed or len(lst) >= self.max_idle:
            conn.close()
            return
        conn.idle_since = asyncio.get_running_loop().time()
        lst.append(conn)

    async def _connect(self, key: ConnKey) -> _Conn:
        host, port, tls = key
        loop = asyncio.get_running_loop()
        ctx = None
        if tls:
            if self._ssl is None:
                self._ssl = _ssl.create_default_context()
            ctx = self._ssl
        try:
            _, conn = await asyncio.wait_for(
                loop.create_connection(lambda: _Conn(key, self), host, port, ssl=ctx), self.connect_timeout
            )
        except asyncio.TimeoutError:
            raise ConnectError(f"connect to {host}:{port} timed out after {self.connect_timeout:g} s") from None
        except OSError as e:
            raise ConnectError(f"connect to {host}:{port}: {e.strerror or e}") from None
        return conn

    async def _acquire(self, key: ConnKey) -> tuple[_Conn, bool]:
        """A pooled connection (True) or a new one (False), with at most `max_connecting` connects."""
        conn = self._take_idle(key, asyncio.get_running_loop().time())
        if conn is not None:
            return conn, True
        host = self.hosts.get(key)
        if host is None:
            host = self.hosts[key] = _Host(self.max_connecting)
        queued_at = time.monotonic()
        async with host.slots:
            conn = self._take_idle(key, asyncio.get_running_loop().time())
            if conn is not None:
                return conn, True
            if host.failed_at > queued_at:
                raise ConnectError(host.error)
            try:
                return await self._connect(key), False
            except ConnectError as e:
                host.failed_at = time.monotonic()
                host.error = str(e)
                raise

    async def request(self, key: ConnKey, head: bytes, body: bytes, timeout: float | None = None) -> Response:
        """Send one request (`head` ends with the blank line) and wait for the response head,
        at most `timeout` seconds (default `read_timeout`)."""
        loop = asyncio.get_running_loop()
        conn, reused = await self._acquire(key)
        while True:
            resp = Response(conn, loop, self.read_timeout if timeout is None else timeout)
            conn.resp = resp
            try:
                if conn.closed or conn.transport is None or conn.transport.is_closing():
                    raise ConnectionLost("connection closed before the request was sent")
                if len(body) > 65536:
                    conn.transport.writelines((head, body))  # no copy of a large body
                else:
                    conn.transport.write(head + body)
            except (RuntimeError, OSError) as e:
                # uvloop raises RuntimeError on a closed transport: a transport failure, not a bug
                resp.close()
                if not reused:
                    raise ConnectionLost(f"write failed: {e}") from None
                reused = False
                conn = await self._connect(key)
                continue
            except ConnectionLost:
                resp.close()
                if not reused:
                    raise
                reused = False
                conn = await self._connect(key)
                continue
            try:
                await resp.start()
                return resp
            except ConnectionLost:
                resp.close()
                if not (reused and not resp._got_bytes):
                    raise
                # a stale pooled connection: re-send once on a fresh one
                reused = False
                conn = await self._connect(key)
            except BaseException:
                resp.close()
                raise

    def close(self) -> None:
        self._closed = True
        for lst in self.idle.values():
            for c in lst:
                c.close()
        self.idle.clear()
