"""Helpers for router tests: routing tables on disk and a router with test-speed options."""

from __future__ import annotations

import asyncio
import json
from contextlib import asynccontextmanager
from pathlib import Path

import aiohttp

from hetcompile.plan.routing import RoutingTable
from hetcompile.router import Router, RouterOptions

FAST = dict(
    health_interval=0.05,
    health_timeout=0.5,
    connect_timeout=1.0,
    read_timeout=5.0,
    retry_backoff=0.01,
    shutdown_timeout=0.5,
)


def replica(id: str, endpoint: str | None, model: str = "tiny", **kw) -> dict:
    r = {
        "id": id,
        "model": model,
        "endpoint": endpoint,
        "kv_capacity_tokens": 100_000,
        "max_num_seqs": 256,
        "prefill_tokens_per_s": 10_000.0,
        "decode_tokens_per_s": 1_000.0,
    }
    r.update(kw)
    return r


def klass(name: str, weights: dict[str, float], match: dict | None = None, **kw) -> dict:
    c = {
        "name": name,
        "match": match or {},
        "input_tokens": 100.0,
        "output_tokens": 50.0,
        "weights": [{"replica": k, "weight": v} for k, v in sorted(weights.items())],
    }
    c.update(kw)
    return c


def table(replicas: list[dict], models: dict[str, list[dict]] | None = None, policy: str = "weighted", **kw) -> dict:
    """A routing table; by default one model `tiny` with one class weighting all replicas equally."""
    if models is None:
        models = {"tiny": [klass("default", {r["id"]: 1.0 / len(replicas) for r in replicas})]}
    t = {
        "version": 1,
        "plan": "test",
        "policy": policy,
        "models": [{"name": n, "classes": cs} for n, cs in sorted(models.items())],
        "replicas": sorted(replicas, key=lambda r: r["id"]),
    }
    t.update(kw)
    RoutingTable.model_validate(t)  # a test table must be a valid table
    return t


def write_table(path: Path, t: dict) -> Path:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(t))
    tmp.replace(path)  # atomic, as deploy.sh should do it
    return path


@asynccontextmanager
async def running_router(table_path: Path, policy: str | None = None, auth_token: str | None = None, **opts):
    options = RouterOptions(**{**FAST, **opts})
    r = Router(table_path, policy=policy, auth_token=auth_token, options=options)
    await r.start("127.0.0.1", 0)
    try:
        yield r
    finally:
        await r.stop()


async def wait_for(pred, timeout: float = 5.0, step: float = 0.01) -> None:
    """Wait until `pred()` is true (a condition, not a timing assertion)."""
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not pred():
        if loop.time() > end:
            raise AssertionError("condition not reached")
        await asyncio.sleep(step)


async def post(session: aiohttp.ClientSession, url: str, body: dict | bytes, **kw) -> tuple[int, dict | str, dict]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    async with session.post(url, data=data, headers={"Content-Type": "application/json", **kw.pop("headers", {})}, **kw) as r:
        text = await r.text()
        try:
            return r.status, json.loads(text), dict(r.headers)
        except ValueError:
            return r.status, text, dict(r.headers)
