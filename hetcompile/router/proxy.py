"""The forwarding hot path: pick a replica, send the original body, pass the answer back.

Per request: read the body (size-limited by aiohttp's `client_max_size`), parse only the routing
fields (classify.py), find the model and workload class in a snapshot of the table (a reload
mid-request does not affect it), let the class's picker choose, then POST the unchanged bytes to
`endpoint + path` over the pooled client session.

Failover: a connection error, a timeout, a 5xx, or a response that breaks before its first body
byte reaches the client is retried on another replica, at most `max_retries` times; when every
candidate has been tried, the next attempt waits an exponential backoff and may reuse them.
Non-streaming responses are read whole before anything is sent, so they are always retryable;
a stream is retryable until its first chunk. A stream that breaks after that ends with an SSE
error event (vLLM's own format) and `data: [DONE]`; the client never waits on a dead upstream
because the upstream read has an idle timeout. Only whole SSE events are written, so a break
never leaves the client a torn event. When the client goes away, the handler is cancelled
(`handler_cancellation=True`) and the upstream connection is closed, which aborts the
request in vLLM.

Admission (issue 18): a new request goes only to a replica below its admission bound (the
plan's C + queue, state.py); when every candidate is full it is answered 429 with Retry-After at
once, so the queue, hence the TTFT of what was admitted, stays bounded however far offered load
exceeds the plan. An admitted request is never refused later: its failover prefers a replica
with room and takes a full one rather than fail. Nothing already streaming is ever cut.

First byte: an attempt that has sent the client nothing within the replica's first-byte
timeout (the first SSE chunk of a stream, which vLLM sends after prefill; the head of a plain
answer, which vLLM sends when the last token is done, so that deadline adds `max_tokens` of the
slowest planned decode) is abandoned, counted against the replica like a failed connect, and
retried elsewhere. A replica that accepts requests and never answers while /health says 200 is
so ejected after `fail_threshold` attempts, in one timeout rather than the whole read timeout.

Disaggregated groups (issue 35, disagg.py): when the class's picker chooses a group, the request
runs in two steps inside it, each step on a member chosen by the group's own picker, with that
member's health, ejection, admission and lease: a prefill (the rewritten body, one token,
answered whole) and a decode (the client's body with the prefill's `kv_transfer_params`, passed
back as an aggregated replica's answer is). A failed prefill is retried on another prefill
replica; a decode that fails before the client got a byte is retried on another decode replica
after a new prefill (`forward_group` says why the first prefill's KV is not reused). Each side
has the budget of `max_retries` retries; when they are spent the group counts as one failed
attempt of the class.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from aiohttp import compression_utils, web

from hetcompile.router.disagg import GroupState, PdTries, answered_kv_params, decode_body, pd_request_id, prefill_body
from hetcompile.router.metrics import RouterMetrics
from hetcompile.router.table import ClassRoute, RouteTable
from hetcompile.router.upstream import UpstreamPool
from hetcompile.router.classify import BadRequest, RequestInfo, match_class, parse_request, predicted_output_tokens
from hetcompile.router.upstream import Response as UpstreamResponse
from hetcompile.router.upstream import ReadTimeout, UpstreamError

if TYPE_CHECKING:
    from hetcompile.router.policies import Candidate, Picker
    from hetcompile.router.state import Lease, ReplicaState

log = logging.getLogger("hetcompile.router")

# client headers worth passing on (tracing); everything else is the router's business
_FORWARD_HEADERS = ("X-Request-Id", "traceparent", "tracestate")
# a stream with no event boundary for this long is passed on as it is rather than held
_MAX_PENDING = 1 << 16
# RuntimeError: uvloop raises it for an operation on a closed transport
_UPSTREAM_ERRORS = (UpstreamError, OSError, asyncio.TimeoutError, RuntimeError)
# the OpenAI error type of a request the router refuses to route (bad body, too large)
INVALID_REQUEST = "invalid_request_error"
# request Content-Encodings aiohttp inflates (one coding; br and zstd only with their libraries)
DECODED_ENCODINGS = frozenset({"", "identity", "gzip", "deflate"}
                              | ({"br"} if compression_utils.HAS_BROTLI else set())
                              | ({"zstd"} if getattr(compression_utils, "HAS_ZSTD", False) else set()))


def error_body(status: int, message: str, type_: str, param: str | None = None) -> bytes:
    """An OpenAI/vLLM-style error object."""
    return json.dumps({"error": {"message": message, "type": type_, "param": param, "code": status}}).encode()


def error_response(status: int, message: str, type_: str, param: str | None = None) -> web.Response:
    return web.Response(status=status, body=error_body(status, message, type_, param), content_type="application/json")


def invalid_request(status: int, message: str, param: str | None = None) -> web.Response:
    """A 4xx for input the router cannot use, typed as OpenAI types it (`invalid_request_error`)."""
    return error_response(status, message, INVALID_REQUEST, param)


def forwarded_headers(request: web.Request, request_id: str | None = None) -> bytes:
    """The client's tracing headers, as header lines to send upstream; `request_id`, when given,
    replaces the client's X-Request-Id."""
    extra = b""
    for h in _FORWARD_HEADERS:
        v = request_id if request_id is not None and h == "X-Request-Id" else request.headers.get(h)
        if v is not None and "\r" not in v and "\n" not in v:
            extra += f"{h}: {v}\r\n".encode("latin-1", "replace")
    return extra


def _sse_cut(buf: bytes) -> int:
    """Length of the prefix of `buf` made of whole SSE events (ending in a blank line)."""
    a = buf.rfind(b"\n\n")
    b = buf.rfind(b"\r\n\r\n")
    return max(a + 2 if a >= 0 else 0, b + 4 if b >= 0 else 0)


def first_byte_deadline(replica: "ReplicaState", stream: bool, max_tokens: int | None, read_timeout: float) -> float:
    """Seconds this attempt may take before the client would see its first byte.

    A stream's first chunk comes after prefill: the replica's first-byte timeout. A plain
    answer comes whole, after its last token: add `max_tokens` at the slowest planned decode
    (`token_time`); without `max_tokens` its length is unknown and only `read_timeout` holds.
    Never beyond `read_timeout`, the longest silence the router accepts at all.
    """
    t = replica.first_byte_timeout
    if not stream:
        if max_tokens is None:
            return read_timeout
        t += max(max_tokens, 0) * replica.token_time
    return min(t, read_timeout)


def overloaded(model: str, cls: str, replicas) -> web.Response:
    """429 with Retry-After: every candidate replica of the class is at its admission bound."""
    wait = min((r.retry_after for r in replicas if r.endpoint is not None), default=1)
    resp = error_response(
        429,
        f"model {model!r} (class {cls!r}) is at the load its plan was sized for: every replica's queue "
        f"is full; retry after {wait} s",
        "RateLimitError",
    )
    resp.headers["Retry-After"] = str(wait)
    return resp


class _Retry(Exception):
    """This attempt failed before anything reached the client; try another replica."""

    def __init__(self, kind: str, detail: str):
        self.kind = kind
        self.detail = detail


@dataclass(slots=True)
class Outbound:
    """One client request as its attempts forward it."""

    request: web.Request
    model: str
    cls: ClassRoute
    info: RequestInfo
    target: bytes  # the request line's path
    body: bytes  # the client's body, unchanged
    extra: bytes  # forwarded tracing headers
    kv_tokens: float  # I_r + Õ_r
    out_tokens: float  # Õ_r


def _kv_params(resp: web.StreamResponse) -> dict | None:
    """The kv_transfer_params of a prefill's 200 answer (forward() read it whole); `_Retry` when
    the answer is not what a prefill answers."""
    body = resp.body if isinstance(resp, web.Response) else None
    if not isinstance(body, bytes):
        raise _Retry("prefill_bad_answer", "the prefill's answer has no body")
    try:
        return answered_kv_params(body)
    except ValueError as e:
        raise _Retry("prefill_bad_answer", str(e)) from None


class Proxy:
    """Request handlers for the OpenAI endpoints, on the router's table, upstream pool and metrics."""

    def __init__(self, *, metrics: RouterMetrics, table: Callable[[], RouteTable], upstream: Callable[[], UpstreamPool],
                 read_timeout: float, max_retries: int, retry_backoff: float, fail_threshold: int,
                 auth_token: str | None):
        # table and upstream are read per request: a reload swaps the table, startup opens the pool
        self.table, self.upstream, self.m = table, upstream, metrics
        self.read_timeout = read_timeout
        self.max_retries = max_retries
        self.backoff = retry_backoff
        self.fall = fail_threshold
        self.auth = f"Bearer {auth_token}".encode() if auth_token else None

    def authorized(self, request: web.Request) -> bool:
        if self.auth is None:
            return True
        got = request.headers.get("Authorization", "").encode()
        return hmac.compare_digest(got, self.auth)

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self.handle(request, chat=False)

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        return await self.handle(request, chat=True)

    async def handle(self, request: web.Request, chat: bool) -> web.StreamResponse:
        t0 = time.perf_counter()
        m = self.m
        if not self.authorized(request):
            m.errors.inc(("unauthorized",))
            return error_response(401, "missing or wrong bearer token", "AuthenticationError")
        enc = request.headers.get("Content-Encoding", "").strip().lower()
        if enc not in DECODED_ENCODINGS:  # aiohttp would hand the still-encoded bytes on as the body
            m.errors.inc(("bad_request",))
            return invalid_request(415, f"malformed HTTP request: Content-Encoding {enc!r} is not supported "
                                        f"(send {', '.join(sorted(x for x in DECODED_ENCODINGS if x))} or none)")
        try:
            body = await request.read()
        except web.HTTPRequestEntityTooLarge as e:
            m.errors.inc(("too_large",))
            return invalid_request(413, e.text or "request body too large")
        except web.RequestPayloadError as e:
            # a body aiohttp cannot decode: a Content-Encoding (gzip, deflate) that does not inflate
            m.errors.inc(("bad_request",))
            return self.unreadable_body(request, e)
        table = self.table()  # snapshot for the whole request
        try:
            info = parse_request(body, chat, table.chars_per_token)
        except BadRequest as e:
            m.errors.inc(("bad_request",))
            return invalid_request(400, str(e), e.param)
        name = info.model if info.model is not None else table.only_model
        model = table.models.get(name) if name is not None else None
        if model is None:
            m.errors.inc(("unknown_model",))
            known = ", ".join(sorted(table.models))
            return error_response(404, f"The model `{info.model}` does not exist. Served: {known}.", "NotFoundError")
        cls = model.classes[match_class(model.matches, info, request.headers)]
        out_tokens = info.n_seqs * predicted_output_tokens(cls.output_tokens, info.max_tokens)
        kv_tokens = info.prompt_tokens + out_tokens  # I_r + Õ_r
        out = Outbound(request, model.name, cls, info, request.raw_path.encode("latin-1", "replace"), body,
                       forwarded_headers(request), kv_tokens, out_tokens)
        resp = await self.attempts(out)
        m.requests.inc((model.name, cls.name, str(resp.status)))
        m.latency.observe((model.name,), time.perf_counter() - t0)
        return resp

    async def attempts(self, out: Outbound) -> web.StreamResponse:
        """Try the class's candidates, a replica or a group each time, until one answers; else the
        router's own answer (429, 503 or 502)."""
        m = self.m
        picker = out.cls.picker
        tried: list["Candidate"] = []
        last_error = "no replica was tried"
        for attempt in range(self.max_retries + 1):
            choice = await self.pick(picker, out.kv_tokens, out.info.prompt_tokens, out.out_tokens, tried, attempt)
            if choice is None:
                break
            replica, cost, overflow = choice
            m.choices.inc((out.cls.policy, replica.id))
            if overflow:
                m.kv_overflow.inc((out.model, out.cls.name))
            lease = replica.acquire(out.kv_tokens, cost)
            final = attempt == self.max_retries
            try:
                if isinstance(replica, GroupState):
                    # it retries within itself: its last try is the class's unless another candidate is left
                    return await self.forward_group(out, replica, lease, final or not picker.eligible([*tried, replica]))
                return await self.forward(out.request, replica, lease, out.target, out.body, out.extra, out.info.stream,
                                          final=final, max_tokens=out.info.max_tokens)
            except _Retry as r:
                lease.release()
                replica.passive_failure(self.fall)
                m.errors.inc((r.kind,))
                last_error = f"{replica.id}: {r.detail}"
                tried.append(replica)
                # a group has retried within itself: try again only on another candidate
                if final or (isinstance(replica, GroupState) and not picker.eligible(tried)):
                    break
                m.retries.inc((replica.id,))
            except asyncio.CancelledError:
                # the client went away (handler cancellation); forward already closed upstream
                lease.release()
                m.errors.inc(("client_disconnect",))
                raise
            except BaseException:
                lease.release()
                raise
        return self.no_answer(out, picker, tried, last_error)

    def no_answer(self, out: Outbound, picker: "Picker", tried: list, last_error: str) -> web.Response:
        """The router's answer when no attempt answered: 429 (every candidate full), 503 (none
        deployed) or 502 (every attempt failed)."""
        m = self.m
        if not tried and any(r.endpoint is not None for r in picker.replicas):
            m.rejected.inc((out.model, out.cls.name))
            return overloaded(out.model, out.cls.name, picker.replicas)
        if not tried:
            m.errors.inc(("no_replica",))
            return error_response(503, f"no deployed replica for model {out.model!r} class {out.cls.name!r}",
                                  "ServiceUnavailableError")
        m.errors.inc(("exhausted",))
        return error_response(502, f"every attempt failed; last: {last_error}", "BadGatewayError")

    async def pick(self, picker, kv_tokens: float, prompt_tokens: float, out_tokens: float,
                   tried: list["Candidate"], attempt: int):
        """The replica for this attempt, or None: at attempt 0 (admission) None means every
        candidate is full or none is deployed; later, every candidate failed even after a backoff."""
        if attempt == 0:
            return picker.choose(kv_tokens, prompt_tokens, out_tokens, None, bounded=True)
        # admitted already: prefer room, but a full replica beats losing the request
        choice = (picker.choose(kv_tokens, prompt_tokens, out_tokens, tried, bounded=True)
                  or picker.choose(kv_tokens, prompt_tokens, out_tokens, tried))  # fmt: skip
        if choice is None:
            # every candidate failed once: back off, then let them be tried again
            await asyncio.sleep(min(self.backoff * (2 ** (attempt - 1)), 1.0))
            choice = (picker.choose(kv_tokens, prompt_tokens, out_tokens, None, bounded=True)
                      or picker.choose(kv_tokens, prompt_tokens, out_tokens, None))  # fmt: skip
        return choice

    @staticmethod
    def unreadable_body(request: web.Request, e: Exception) -> web.Response:
        """400 for a body that broke while being read, on a connection that then closes.

        The rest of such a body cannot be read: marking it ended keeps aiohttp from draining
        it after the response (which re-raises the error as an unhandled exception in the
        server log), and `Connection: close` tells the client not to reuse the connection.
        """
        request.content.feed_eof()
        reason = getattr(e.__cause__, "message", None) or str(e)
        resp = invalid_request(400, f"request body is unreadable: {reason}")
        resp.force_close()
        return resp

    async def forward(
        self,
        request: web.Request,
        replica: "ReplicaState",
        lease: "Lease",
        target: bytes,
        body: bytes,
        extra: bytes,
        stream: bool,
        final: bool,
        max_tokens: int | None = None,
    ) -> web.StreamResponse:
        """One attempt. Raises `_Retry` when it failed before the client saw anything."""
        head = (
            b"POST " + replica.base_path + target + b" HTTP/1.1\r\n" + replica.head_static + extra
            + b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n"
        )  # fmt: skip
        t0 = time.perf_counter()
        first_byte = first_byte_deadline(replica, stream, max_tokens, self.read_timeout)
        try:
            key = replica.conn_key
            assert key is not None  # a routable replica has an endpoint, so a connection key
            up = await self.upstream().request(key, head, body, timeout=first_byte)
        except ReadTimeout:
            raise _Retry("first_byte_timeout", f"no response within {first_byte:g} s") from None
        except _UPSTREAM_ERRORS as e:
            raise _Retry("upstream_connect", str(e) or repr(e)) from None
        try:
            self.m.ttfb.observe((replica.id,), time.perf_counter() - t0)
            ctype = up.headers.get("content-type", "application/json")
            if stream and up.status == 200 and ctype.startswith("text/event-stream"):
                # the rest of the first-byte budget is for the first chunk (vLLM sends the head at once)
                up.set_timeout(max(first_byte - (time.perf_counter() - t0), 1e-3))
                return await self.stream(request, up, replica, lease, ctype, first_byte)
            up.set_timeout(self.read_timeout)
            try:
                data = await up.read()
            except _UPSTREAM_ERRORS as e:
                raise _Retry("upstream_broken", str(e) or repr(e)) from None
            lease.release()
            if up.status >= 500:
                if not final:
                    raise _Retry("upstream_5xx", f"HTTP {up.status}")
                replica.passive_failure(self.fall)
                self.m.errors.inc(("upstream_5xx",))
            else:
                replica.passive_success()
            return web.Response(
                status=up.status, body=data, headers={"Content-Type": ctype, "X-Hetcompile-Replica": replica.id}
            )
        finally:
            # closes the upstream connection unless the body was read to the end: that is
            # what cancels the request in vLLM when the client left or a retry abandons it
            up.release()

    async def stream(
        self, request: web.Request, up: UpstreamResponse, replica: "ReplicaState", lease: "Lease", ctype: str,
        first_byte: float,
    ) -> web.StreamResponse:
        """Pass an SSE stream through, event by event, as the upstream produces it."""
        # the first chunk decides between retry (nothing sent yet) and streaming
        try:
            first = await up.readany()
        except ReadTimeout:
            raise _Retry("first_byte_timeout", f"no first chunk within {first_byte:g} s") from None
        except _UPSTREAM_ERRORS as e:
            raise _Retry("upstream_broken", str(e) or repr(e)) from None
        if not first:
            raise _Retry("upstream_broken", "stream ended before its first byte")
        up.set_timeout(self.read_timeout)  # from here on, only silence is bounded
        out = web.StreamResponse(
            status=200,
            headers={
                "Content-Type": ctype,
                "Cache-Control": "no-cache",
                "X-Accel-Buffering": "no",
                "X-Hetcompile-Replica": replica.id,
            },
        )
        try:
            await out.prepare(request)
            pending = b""
            chunk = first
            broke: str | None = None
            while True:
                if pending:
                    chunk = pending + chunk
                    pending = b""
                if not chunk.endswith(b"\n\n"):
                    cut = _sse_cut(chunk)
                    if cut == 0 and len(chunk) > _MAX_PENDING:
                        cut = len(chunk)
                    pending = chunk[cut:]
                    chunk = chunk[:cut]
                if chunk:
                    await out.write(chunk)  # raises ConnectionResetError when the client left
                try:
                    chunk = await up.readany()
                except _UPSTREAM_ERRORS as e:
                    broke = str(e) or repr(e)
                    break
                if not chunk:
                    break
            if broke is not None:
                log.warning("stream from %s broke after the first byte: %s", replica.id, broke)
                self.m.errors.inc(("stream_broken",))
                replica.passive_failure(self.fall)
                msg = f"upstream replica {replica.id} failed mid-stream: {broke}"
                await out.write(b"data: " + error_body(502, msg, "BadGatewayError") + b"\n\ndata: [DONE]\n\n")
            else:
                if pending:
                    await out.write(pending)
                replica.passive_success()
            await out.write_eof()
        except ConnectionResetError:
            # the client went away: closing `up` aborts the request upstream; aiohttp treats
            # a returned response on a dead connection as a normal client disconnect
            self.m.errors.inc(("client_disconnect",))
            up.close()
        except asyncio.CancelledError:
            up.close()  # counted by handle()
            raise
        finally:
            lease.release()
        return out

    # -- disaggregated groups (disagg.py) -----------------------------------------------------

    async def forward_group(self, out: Outbound, group: GroupState, lease: "Lease", final: bool) -> web.StreamResponse:
        """One attempt on a disaggregated group: a prefill, then a decode with its KV.

        Raises `_Retry` when every try failed (the class may try another candidate). A decode
        that failed is retried after a new prefill, not with the KV the last one made: NIXL's
        decode pulls the prompt's blocks from the prefill (a READ) and then tells it to free
        them (the prefill keeps them until that notice, or, since vLLM 0.32, while the decode's
        heartbeats renew their lease, `kv_lease_duration`, 30 s by default); the router cannot tell whether a decode that failed
        (a 5xx or a timeout after the transfer) had pulled them already, and a second READ of
        freed blocks, reused by another request, would read that request's KV.
        """
        try:
            req = json.loads(out.body)  # an object: parse_request checked it
            p_body = prefill_body(req)
            s = PdTries()
            while s.decodes <= self.max_retries:
                # one X-Request-Id for a prefill and its decode (disagg.py), a new one per try: a
                # re-run prefill must not meet the last one's request, which may still hold its KV
                extra = forwarded_headers(out.request, pd_request_id(out.request.headers.get("X-Request-Id")))
                # the decode replica is chosen first and holds the request while the prefill runs:
                # its admission bound and KV estimate count the request from admission on, as an
                # aggregated replica's do (its KV lands there)
                decode, d_lease = await self._reserve_decode(out, group, s)
                try:
                    kv = await self._prefill(out, group, p_body, extra, s)
                    if isinstance(kv, web.StreamResponse):
                        return kv
                    resp = await self._decode(out, group, decode, d_lease, decode_body(req, kv), extra, s, final)
                finally:
                    d_lease.release()
                if resp is not None:
                    return resp
            raise _Retry("pd_exhausted", f"group {group.id}: every decode failed; last: {s.last}")
        finally:
            lease.release()

    async def _reserve_decode(self, out: Outbound, group: GroupState, s: PdTries) -> tuple["ReplicaState", "Lease"]:
        """The decode replica of this try, with the request's lease on it."""
        # admitted already (the class's picker saw room in the group): prefer room, never refuse.
        # T_r^s with no prompt tokens: the decode pulls the prompt's KV, it does not compute it
        choice = await self.pick(group.decode, out.kv_tokens, 0.0, out.out_tokens, s.d_tried, max(s.decodes, 1))
        if choice is None:
            raise _Retry("no_replica", f"group {group.id} has no deployed decode replica")
        replica, cost, _ = choice
        self.m.choices.inc((group.policy, replica.id))
        return replica, replica.acquire(out.kv_tokens, cost)

    async def _prefill(self, out: Outbound, group: GroupState, body: bytes, extra: bytes,
                       s: PdTries) -> dict | None | web.StreamResponse:
        """Prefills until one answers: its kv_transfer_params (None: it handed no KV over), or the
        answer of a prefill that refused the request (a 4xx, the client's error, for the client)."""
        m = self.m
        info = out.info
        kv_tokens = info.prompt_tokens + info.n_seqs  # the prompt and one token, held until the decode pulls them
        while True:
            # admitted already (the class's picker saw room in the group): prefer room, never refuse
            choice = await self.pick(group.prefill, kv_tokens, info.prompt_tokens, info.n_seqs, s.p_tried, max(s.prefills, 1))
            if choice is None:
                raise _Retry("no_replica", f"group {group.id} has no deployed prefill replica")
            replica, cost, _ = choice
            m.choices.inc((group.policy, replica.id))
            s.prefills += 1
            lease = replica.acquire(kv_tokens, cost)
            t0 = time.perf_counter()
            try:
                resp = await self.forward(out.request, replica, lease, out.target, body, extra, False, final=False, max_tokens=1)
                if resp.status != 200:
                    m.pd_attempts.inc((group.id, "prefill", "client_error"))
                    return resp
                kv = _kv_params(resp)
            except _Retry as r:
                s.prefill_fails += 1
                more = s.prefill_fails <= self.max_retries
                self._member_failed(group, "prefill", replica, r, more, s)
                s.p_tried.append(replica)
                if not more:
                    raise _Retry("pd_exhausted", f"group {group.id}: every prefill failed; last: {s.last}") from None
                continue
            finally:
                lease.release()
            m.pd_phase.observe((group.id, "prefill"), time.perf_counter() - t0)
            m.pd_attempts.inc((group.id, "prefill", "ok" if kv is not None else "no_kv_params"))
            return kv

    async def _decode(self, out: Outbound, group: GroupState, replica: "ReplicaState", lease: "Lease", body: bytes,
                      extra: bytes, s: PdTries, final: bool) -> web.StreamResponse | None:
        """The decode, answered or streamed to the client; None when it failed before the client
        got a byte (the caller tries again, with a new prefill, while decodes are left)."""
        m = self.m
        s.decodes += 1
        more = s.decodes <= self.max_retries
        t0 = time.perf_counter()
        try:
            # the last decode of the class's last attempt passes a 5xx on, as an aggregated replica's
            resp = await self.forward(out.request, replica, lease, out.target, body, extra, out.info.stream,
                                      final=final and not more, max_tokens=out.info.max_tokens)
        except _Retry as r:
            self._member_failed(group, "decode", replica, r, more, s)
            s.d_tried.append(replica)
            return None
        m.pd_phase.observe((group.id, "decode"), time.perf_counter() - t0)
        m.pd_attempts.inc((group.id, "decode", "ok" if resp.status < 500 else "failed"))
        return resp

    def _member_failed(self, group: GroupState, role: str, replica: "Candidate", r: _Retry, more: bool, s: PdTries) -> None:
        """Count a failed prefill or decode against its replica, as a failed aggregated attempt is."""
        replica.passive_failure(self.fall)
        self.m.errors.inc((r.kind,))
        self.m.pd_attempts.inc((group.id, role, "failed"))
        if more:
            self.m.retries.inc((replica.id,))
        s.last = f"{replica.id}: {r.detail}"
