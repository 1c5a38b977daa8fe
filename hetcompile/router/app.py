"""The router process: the aiohttp application, its lifecycle, hot reload and `serve`.

Surface:
  POST /v1/completions, /v1/chat/completions   proxied (proxy.py); bearer auth when configured
  GET  /v1/models                              the union of the table's models
  GET  /health                                 the router itself (200 while it runs), with counts
  GET  /metrics                                the router's Prometheus metrics (metrics.py)
  POST /admin/reload                           re-read the table (also SIGHUP under `serve`)
  GET  /admin/status                           per-replica state, for operators and tests

A reload validates and compiles the new table first and then swaps one reference; requests
already running keep the table snapshot and replica states they started with, so a reload
drops nothing. A table that fails to load leaves the old one serving.

Use `serve(...)` to run it (blocks), or in a test `async with Router(path) as r:` / `await
r.start()` ... `await r.stop()`; `build_app(router)` gives the bare `web.Application`.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from dataclasses import asdict, dataclass
from pathlib import Path

import aiohttp
from aiohttp import web

from hetcompile.plan.routing import POLICIES
from hetcompile.router.health import HealthMonitor
from hetcompile.router.metrics import RouterMetrics
from hetcompile.router.proxy import Proxy, error_response, invalid_request
from hetcompile.router.state import Limits
from hetcompile.router.table import RouteTable, RouterError, compile_table, load_table
from hetcompile.router.upstream import UpstreamPool
from aiohttp.web_protocol import RequestHandler


class _OpenAIErrors(RequestHandler):
    """aiohttp's connection handler, except that what it answers itself (a request it cannot parse:
    broken framing or chunked encoding, an unsupported Content-Encoding, an over-long header; or an
    unhandled error) has the body of every other error of the router: an OpenAI error object in
    JSON, not aiohttp's plain text. It still logs as aiohttp does and closes the connection."""

    __slots__ = ()

    def handle_error(self, request, status: int = 500, exc: BaseException | None = None,
                     message: str | None = None) -> web.StreamResponse:
        plain = super().handle_error(request, status, exc, message)  # logs; raises if a response was sent
        if status >= 500:
            resp = error_response(status, "internal error in the router", "InternalServerError")
        else:
            resp = invalid_request(status, f"malformed HTTP request: {message or plain.reason}")
        resp.force_close()
        return resp


class _Server(web.Server):
    """web.Server whose connections get _OpenAIErrors (the same handler, one method replaced)."""

    def __call__(self) -> RequestHandler:
        handler = super().__call__()
        handler.__class__ = _OpenAIErrors
        return handler

log = logging.getLogger("hetcompile.router")


@dataclass(frozen=True)
class RouterOptions:
    """Tunables; the defaults are safe for production."""

    max_body_bytes: int = 16 * 1024 * 1024  # request bodies above this get 413
    connect_timeout: float = 5.0  # seconds to open an upstream connection
    read_timeout: float = 600.0  # longest silence from an upstream (a stream's idle gap, or a whole non-streamed answer)
    max_retries: int = 2  # extra attempts on other replicas, before the first byte only
    retry_backoff: float = 0.05  # seconds; doubles per retry once every candidate was tried
    health_interval: float = 1.0  # seconds between polls of /health and /metrics
    health_timeout: float = 2.0
    fail_threshold: int = 3  # consecutive failures that eject a replica
    rise_threshold: int = 2  # consecutive successful polls that re-admit it
    kv_high_water: float = 0.95  # kv-aware: mask when u_s + request/KV_s passes this (vLLM preempts at 1)
    theta: float = 2.0  # min-max: w = T·exp(θ·kvusage), 004 uses θ = 2
    upstream_keepalive: float = 4.0  # idle pooled connections are closed before vLLM's (uvicorn, 5 s) do
    access_log: bool = False
    shutdown_timeout: float = 30.0  # grace for in-flight requests on stop
    # admission bound per replica: None = the plan's (planned_concurrency + max_queue in the
    # table), 0 = none, N = N for every replica; a new request finding every candidate full gets 429
    max_inflight: int | None = None
    # seconds an attempt may go without a first byte before it fails over: None = the table's
    # per-replica first_byte_timeout_s (else 30 s)
    first_byte_timeout: float | None = None

    def __post_init__(self) -> None:
        for name in ("connect_timeout", "read_timeout", "health_interval", "health_timeout", "kv_high_water", "theta"):
            if getattr(self, name) <= 0:
                raise RouterError(f"option {name} must be > 0, got {getattr(self, name)}")
        if self.max_body_bytes < 1024:
            raise RouterError("option max_body_bytes must be >= 1024")
        if self.max_retries < 0 or self.fail_threshold < 1 or self.rise_threshold < 1:
            raise RouterError("max_retries must be >= 0, fail_threshold and rise_threshold >= 1")
        if self.max_inflight is not None and self.max_inflight < 0:
            raise RouterError(f"option max_inflight must be >= 0 (0: no bound), got {self.max_inflight}")
        if self.first_byte_timeout is not None and not self.first_byte_timeout > 0:
            raise RouterError(f"option first_byte_timeout must be > 0, got {self.first_byte_timeout}")


class Router:
    """A routing proxy over one routing table file. Loads the table at construction."""

    def __init__(
        self,
        table: Path | str,
        *,
        policy: str | None = None,
        auth_token: str | None = None,
        options: RouterOptions | None = None,
    ):
        if policy is not None and policy not in POLICIES:
            raise RouterError(f"unknown policy {policy!r}; choose one of {', '.join(POLICIES)}")
        self.table_path = Path(table)
        self.policy_override = policy
        self.auth_token = auth_token or None
        self.options = options or RouterOptions()
        self.metrics = RouterMetrics(lambda: self.table.replicas.values())
        self.table: RouteTable = self._compile(None)
        self.session: aiohttp.ClientSession | None = None  # health polls
        self.upstream: UpstreamPool | None = None  # proxied requests (the hot path)
        self.health: HealthMonitor | None = None
        self.app = build_app(self)
        self._runner: web.AppRunner | None = None
        self.host: str | None = None
        self.port: int | None = None

    # -- table -------------------------------------------------------------------------------

    def _compile(self, previous: RouteTable | None) -> RouteTable:
        o = self.options
        source = load_table(self.table_path)
        try:
            limits = Limits(max_inflight=o.max_inflight, first_byte_timeout=o.first_byte_timeout)
            t = compile_table(source, previous.replicas if previous else None, policy_override=self.policy_override,
                              high_water=o.kv_high_water, theta=o.theta, limits=limits,
                              previous_groups=previous.groups if previous else None)
        except ValueError as e:
            raise RouterError(f"routing table {self.table_path}: {e}") from None
        self.metrics.table_info.values = {(t.source.plan, t.source.spec_hash): 1.0}
        return t

    def pool(self) -> UpstreamPool:
        """The upstream connections of a started router (the proxy asks for them per request)."""
        if self.upstream is None:
            raise RuntimeError("the router has not started")
        return self.upstream

    def reload_now(self) -> RouteTable:
        """Re-read the table file and swap it in; raises `RouterError` and keeps the old one."""
        try:
            new = self._compile(self.table)
        except RouterError:
            self.metrics.reloads.inc(("error",))
            raise
        self.table = new  # the one switch: new requests see the new table from here on
        if self.health is not None:
            self.health.sync(list(new.replicas.values()))
        self.metrics.reloads.inc(("ok",))
        log.info("reloaded %s: %d models, %d replicas", self.table_path, len(new.models), len(new.replicas))
        return new

    async def reload(self) -> RouteTable:
        return self.reload_now()

    # -- lifecycle ---------------------------------------------------------------------------

    async def _open(self) -> None:
        o = self.options
        # no cap on connections: thousands of concurrent streams each hold one
        self.upstream = UpstreamPool(
            connect_timeout=o.connect_timeout, read_timeout=o.read_timeout, keepalive=o.upstream_keepalive
        )
        self.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=o.upstream_keepalive),
            timeout=aiohttp.ClientTimeout(total=o.health_timeout),
            cookie_jar=aiohttp.DummyCookieJar(),
        )
        self.health = HealthMonitor(
            self.session,
            interval=o.health_interval,
            timeout=o.health_timeout,
            fall=o.fail_threshold,
            rise=o.rise_threshold,
        )
        self.health.sync(list(self.table.replicas.values()))

    async def _close(self) -> None:
        if self.health is not None:
            await self.health.close()
            self.health = None
        if self.session is not None:
            await self.session.close()
            self.session = None
        if self.upstream is not None:
            self.upstream.close()
            self.upstream = None

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> str:
        """Listen on host:port (0 = an ephemeral port); returns the base URL."""
        o = self.options
        runner = web.AppRunner(
            self.app,
            handler_cancellation=True,  # a client disconnect cancels the handler, hence upstream
            access_log=log if o.access_log else None,
            shutdown_timeout=o.shutdown_timeout,
        )
        await runner.setup()
        runner.server.__class__ = _Server  # malformed requests answered like the router's own 400s
        site = web.TCPSite(runner, host, port, backlog=4096, reuse_address=True)
        try:
            await site.start()
        except BaseException:
            await runner.cleanup()
            raise
        self._runner = runner
        self.host = host
        self.port = runner.addresses[0][1]
        log.info("hetcompile router on %s (plan %s, %d replicas)", self.url, self.table.source.plan, len(self.table.replicas))
        return self.url

    async def stop(self) -> None:
        if self._runner is not None:
            runner, self._runner = self._runner, None
            await runner.cleanup()

    @property
    def url(self) -> str:
        host = self.host or "127.0.0.1"
        if host in ("0.0.0.0", "::", ""):
            host = "127.0.0.1"
        if ":" in host:
            host = f"[{host}]"
        return f"http://{host}:{self.port}"

    async def __aenter__(self) -> "Router":
        await self.start()
        return self

    async def __aexit__(self, *exc) -> None:
        await self.stop()


# -- the application ------------------------------------------------------------------------


def build_app(router: Router) -> web.Application:
    """The aiohttp application of `router`; its startup opens the client session and polling."""
    app = web.Application(client_max_size=router.options.max_body_bytes)
    o = router.options
    proxy = Proxy(metrics=router.metrics, table=lambda: router.table, upstream=router.pool,
                  read_timeout=o.read_timeout, max_retries=o.max_retries, retry_backoff=o.retry_backoff,
                  fail_threshold=o.fail_threshold, auth_token=router.auth_token)

    async def lifecycle(_app: web.Application):
        await router._open()
        yield
        await router._close()

    app.cleanup_ctx.append(lifecycle)

    async def health(_request: web.Request) -> web.Response:
        t = router.table
        body = {
            "status": "ok",
            "plan": t.source.plan,
            "replicas": len(t.replicas),
            "routable": sum(1 for r in t.replicas.values() if r.routable),
        }
        return web.json_response(body)

    async def metrics(_request: web.Request) -> web.Response:
        return web.Response(body=router.metrics.render().encode(), content_type="text/plain", charset="utf-8",
                            headers={"X-Content-Type-Options": "nosniff"})  # fmt: skip

    async def models(request: web.Request) -> web.Response:
        if not proxy.authorized(request):
            return error_response(401, "missing or wrong bearer token", "AuthenticationError")
        return web.Response(body=router.table.models_json, content_type="application/json")

    async def reload(request: web.Request) -> web.Response:
        if not proxy.authorized(request):
            return error_response(401, "missing or wrong bearer token", "AuthenticationError")
        try:
            t = router.reload_now()
        except RouterError as e:
            return invalid_request(400, str(e))  # the old table keeps serving
        return web.json_response({"status": "reloaded", "plan": t.source.plan, "replicas": len(t.replicas)})

    async def status(request: web.Request) -> web.Response:
        if not proxy.authorized(request):
            return error_response(401, "missing or wrong bearer token", "AuthenticationError")
        t = router.table
        reps = {
            r.id: {
                "endpoint": r.endpoint,
                "healthy": r.healthy,
                "routable": r.routable,
                "inflight": r.inflight,
                "inflight_kv_tokens": r.inflight_kv,
                "kv_usage": r.kv_usage(),
                "minmax_load": r.load,
                "observed_kv_usage": r.obs_kv,
                "observed_running": r.obs_running,
                "observed_waiting": r.obs_waiting,
                "max_inflight": r.max_inflight,
                "first_byte_timeout_s": r.first_byte_timeout,
            }
            for r in t.replicas.values()
        }
        for r in t.replicas.values():
            if r.role is not None:
                reps[r.id]["role"] = r.role
        classes = {f"{m.name}/{c.name}": c.policy for m in t.models.values() for c in m.classes}
        body = {"plan": t.source.plan, "options": asdict(router.options), "classes": classes, "replicas": reps}
        if t.groups:
            body["groups"] = {
                g.id: {
                    "model": g.model,
                    "kv_connector": g.kv_connector,
                    "policy": g.policy,
                    "prefill": [r.id for r in g.prefill.replicas],
                    "decode": [r.id for r in g.decode.replicas],
                    "routable": g.routable,
                    "inflight": g.inflight,
                }
                for g in t.groups.values()
            }
        return web.json_response(body)

    app.router.add_post("/v1/completions", proxy.completions)
    app.router.add_post("/v1/chat/completions", proxy.chat_completions)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/health", health)
    app.router.add_get("/metrics", metrics)
    app.router.add_post("/admin/reload", reload)
    app.router.add_get("/admin/status", status)
    return app


# -- the blocking entry point ---------------------------------------------------------------


async def _serve(router: Router, host: str, port: int) -> None:
    await router.start(host, port)
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()

    def on_hup() -> None:
        try:
            router.reload_now()
        except RouterError as e:
            log.error("reload failed, keeping the previous table:\n%s", e)

    for sig, fn in ((signal.SIGHUP, on_hup), (signal.SIGINT, stop.set), (signal.SIGTERM, stop.set)):
        try:
            loop.add_signal_handler(sig, fn)
        except (NotImplementedError, RuntimeError, ValueError):  # not the main thread, or no such signal
            pass
    print(f"hetcompile router listening on {router.url} (plan {router.table.source.plan})", flush=True)
    try:
        await stop.wait()
    finally:
        await router.stop()


def serve(
    table: Path | str,
    host: str = "127.0.0.1",
    port: int = 8080,
    policy: str | None = None,
    auth_token: str | None = None,
    *,
    options: RouterOptions | None = None,
    use_uvloop: bool = True,
) -> None:
    """Run the router until SIGINT/SIGTERM; SIGHUP reloads the table. Blocks.

    Raises `RouterError` for a bad table or option before anything listens.
    """
    router = Router(table, policy=policy, auth_token=auth_token, options=options)
    _raise_fd_limit()
    if use_uvloop:
        try:
            import uvloop  # optional: a faster event loop when installed
        except ImportError:
            pass
        else:
            return uvloop.run(_serve(router, host, port))
    asyncio.run(_serve(router, host, port))



def _raise_fd_limit() -> None:
    """Each proxied request holds two sockets: lift the soft open-files limit to the hard one."""
    try:
        import resource
    except ImportError:  # not POSIX
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard if hard != resource.RLIM_INFINITY else max(soft, 65536), hard))
        except (ValueError, OSError):
            pass
