"""Active health checks and load polling of the replica heads.

Every replica with an endpoint gets one task that, every `interval` seconds, GETs `/health`
(vLLM: 200 when serving, 503 when the engine is dead, connection refused once the process is
gone) and, when healthy, `/metrics`, from which it reads the vLLM v1 gauges
`vllm:kv_cache_usage_perc` (a 0-1 fraction), `vllm:num_requests_running` and
`vllm:num_requests_waiting` (vllm/v1/metrics/loggers.py). With several engines (data parallel)
running and waiting are summed and the KV usage is the largest.

Fall/rise (state.health_transition): eject after `fall` consecutive failures, re-admit after
`rise` consecutive successes. Replicas with `endpoint: null` are never polled nor routed to.
"""

from __future__ import annotations

import asyncio
import logging
import random
from dataclasses import dataclass

import aiohttp

from hetcompile.router.state import ReplicaState

log = logging.getLogger("hetcompile.router")

KV_USAGE = "vllm:kv_cache_usage_perc"
RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"


@dataclass(frozen=True, slots=True)
class VllmGauges:
    kv_usage: float | None = None
    running: float | None = None
    waiting: float | None = None


def _sample_value(line: str) -> float | None:
    """The value of one exposition line `name{labels} value [timestamp]`."""
    rest = line[line.rindex("}") + 1 :] if "}" in line else line.split(None, 1)[1] if " " in line else ""
    parts = rest.split()
    if not parts:
        return None
    try:
        return float(parts[0])
    except ValueError:
        return None


def parse_vllm_metrics(text: str) -> VllmGauges:
    """Read the three gauges routing uses from vLLM's Prometheus text; absent ones are None."""
    kv: float | None = None
    running: float | None = None
    waiting: float | None = None
    for line in text.splitlines():
        if not line.startswith("vllm:"):
            continue
        # the metric name ends at '{' or at the first space; exact match, so that
        # vllm:num_requests_waiting_by_reason is not taken for vllm:num_requests_waiting
        end = len(line)
        for ch in "{ ":
            j = line.find(ch)
            if j != -1 and j < end:
                end = j
        name = line[:end]
        if name not in (KV_USAGE, RUNNING, WAITING):
            continue
        v = _sample_value(line)
        if v is None or v != v:
            continue
        if name == KV_USAGE:
            kv = v if kv is None else max(kv, v)
        elif name == RUNNING:
            running = v if running is None else running + v
        else:
            waiting = v if waiting is None else waiting + v
    return VllmGauges(kv, running, waiting)


class HealthMonitor:
    """One polling task per routable-to-be replica; `sync` follows table reloads."""

    def __init__(self, session: aiohttp.ClientSession, *, interval: float, timeout: float, fall: int, rise: int):
        self.session = session
        self.interval = interval
        self.timeout = aiohttp.ClientTimeout(total=timeout)
        self.fall = fall
        self.rise = rise
        self.tasks: dict[int, tuple[ReplicaState, asyncio.Task]] = {}

    def sync(self, replicas: list[ReplicaState]) -> None:
        """Poll exactly these states (keyed by identity: a moved replica is a new state)."""
        want = {id(r): r for r in replicas if r.endpoint is not None}
        for key in list(self.tasks):
            if key not in want:
                self.tasks.pop(key)[1].cancel()
        for key, r in want.items():
            if key not in self.tasks:
                self.tasks[key] = (r, asyncio.ensure_future(self._loop(r)))

    async def close(self) -> None:
        tasks = [t for _, t in self.tasks.values()]
        self.tasks.clear()
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _loop(self, r: ReplicaState) -> None:
        # a small random phase keeps many replicas from being polled in lockstep
        await asyncio.sleep(random.uniform(0, min(self.interval, 0.05)))
        while True:
            try:
                await self.poll_once(r)
            except asyncio.CancelledError:
                raise
            except Exception:  # a bug in a poll must not end polling for good
                log.exception("health poll of %s failed unexpectedly", r.id)
            await asyncio.sleep(self.interval)

    async def poll_once(self, r: ReplicaState) -> bool:
        """One /health (+ /metrics) round; returns whether /health said 200."""
        base = r.endpoint
        if base is None:
            return False
        ok = False
        try:
            async with self.session.get(base + "/health", headers=r.headers, timeout=self.timeout) as resp:
                await resp.read()
                ok = resp.status == 200
        except (aiohttp.ClientError, OSError, asyncio.TimeoutError) as e:
            log.debug("health of %s: %r", r.id, e)
        gauges = None
        if ok:
            try:
                async with self.session.get(base + "/metrics", headers=r.headers, timeout=self.timeout) as resp:
                    if resp.status == 200:
                        gauges = parse_vllm_metrics(await resp.text(errors="replace"))
                    else:
                        await resp.read()
            except (aiohttp.ClientError, OSError, asyncio.TimeoutError) as e:
                log.debug("metrics of %s: %r", r.id, e)
        # an unreadable /metrics clears the observation: a stale one would mask or unmask wrongly
        g = gauges or VllmGauges()
        r.observe_metrics(g.kv_usage, g.running, g.waiting)
        r.observe_health(ok, self.fall, self.rise)
        return ok
