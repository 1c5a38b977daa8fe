"""`hetcompile profile`: a bounded load sweep against a running vLLM OpenAI server, and the fit.

The sweep (seed 004 §3.2's one-time profiling, kept small): for every prompt length p and every
concurrency level c, c clients each send `requests` streaming /v1/completions requests back to
back. Prompts are token ids (deterministic, exactly p tokens: `prompt` as a list of ints, which the
OpenAI completions API and vLLM accept), outputs are exactly O tokens (`max_tokens` with vLLM's
`ignore_eos`), and `stream_options.include_usage` reports the counts. Per request:

    TTFT = first streamed chunk - send;   ITL = (last chunk - first chunk) / (completion tokens - 1)

Observations for perf/fit.py: every sweep point gives one end-to-end row (a prompt of p tokens,
then O - 1 decode steps among n = c sequences reading S = c (p + O/2) context tokens; seconds =
mean request latency); the points at c = 1 also give TTFT rows (a prompt alone: per-request
overhead plus one prefill step). Streamed chunk times are not fitted directly: when the host is
busy the server coalesces several tokens into one chunk, which makes inter-chunk gaps meaningless. The fit's coefficients, the
measured output tokens/s at the highest concurrency, and a record of the sweep go into a profiles
file the spec includes (`profiles: [profiles.yaml]`).
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from dataclasses import dataclass, field

import aiohttp

from hetcompile.errors import HetcompileError
from hetcompile.perf.fit import Fit, Observation, fit_step_model


class ProfileError(HetcompileError):
    kind = "profile error"


@dataclass(frozen=True)
class SweepConfig:
    concurrency: tuple[int, ...] = (1, 4, 16)
    prompt_tokens: tuple[int, ...] = (16, 64, 128)
    output_tokens: int = 32
    requests: int = 2  # per client and sweep point
    token_id: int = 100  # prompts repeat token ids from here (deterministic, any vocab >= token_id + 7)
    timeout_s: float = 300.0
    api_key: str | None = field(default=None, repr=False)  # vLLM's --api-key (deploy starts replicas with one)


UNAUTHORIZED_HINT = ("the server wants an API key (deploy starts replicas with `--api-key`): pass --api-key-env VAR "
                     "with the key in $VAR, e.g. HC_VLLM_API_KEY=$(cat OUT/vllm.key)")


def _refused(base: str, path: str, status: int, text: str = "") -> ProfileError:
    """A non-200 answer as an error that says what it means: 401/403 is about the key, not the server."""
    if status in (401, 403):
        return ProfileError(f"{base}{path} answered {status}: unauthorized (a missing or wrong API key)", hint=UNAUTHORIZED_HINT)
    return ProfileError(f"{base}{path} answered {status}: {text[:500]}")


@dataclass(frozen=True)
class Sample:
    prompt_tokens: int
    concurrency: int
    ttft_s: float
    itl_s: float | None
    completion_tokens: int
    start: float
    end: float


@dataclass(frozen=True)
class PointResult:
    prompt_tokens: int
    concurrency: int
    ttft_s: float
    itl_s: float
    e2e_s: float
    output_tokens_per_s: float
    samples: int


def prompt_ids(n: int, base: int) -> list[int]:
    return [base + (i % 7) for i in range(n)]


async def served_model(session: aiohttp.ClientSession, base: str) -> str:
    try:
        async with session.get(f"{base}/v1/models") as resp:
            if resp.status != 200:
                raise _refused(base, "/v1/models", resp.status, await resp.text())
            data = await resp.json()
    except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as exc:
        raise ProfileError(f"cannot list models at {base}/v1/models: {exc}",
                           hint="is a vLLM OpenAI server (`vllm serve`) running there?") from None
    ids = [m.get("id") for m in data.get("data", [])]
    if not ids:
        raise ProfileError(f"{base}/v1/models lists no model")
    return ids[0]


# vLLM's OpenAI server (uvicorn) closes a keep-alive connection after 5 s idle. A client that keeps
# it longer can reuse a connection at the instant the server closes it and get ServerDisconnected
# before any response (a 16-client sweep point leaves 16 pooled connections idle while the next,
# 1-client point runs): keep idle connections for less than the server does, and retry a request
# that was disconnected before its response began (nothing was generated; sending it again is safe).
KEEPALIVE_S = 2.0


def client_session(timeout_s: float, headers: dict | None = None) -> aiohttp.ClientSession:
    return aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s), headers=headers or {},
                                 connector=aiohttp.TCPConnector(keepalive_timeout=KEEPALIVE_S))


async def one_request(session: aiohttp.ClientSession, base: str, model: str, p: int, c: int, cfg: SweepConfig) -> Sample:
    try:
        return await _one_request(session, base, model, p, c, cfg)
    except _NotAnswered:
        return await _one_request(session, base, model, p, c, cfg, retry=False)


class _NotAnswered(Exception):
    """The server closed the connection before any response to a request: safe to send again."""


async def _one_request(session: aiohttp.ClientSession, base: str, model: str, p: int, c: int, cfg: SweepConfig,
                       retry: bool = True) -> Sample:
    body = {
        "model": model, "prompt": prompt_ids(p, cfg.token_id), "max_tokens": cfg.output_tokens,
        "min_tokens": cfg.output_tokens, "ignore_eos": True, "temperature": 0.0, "stream": True,
        "stream_options": {"include_usage": True},
    }
    start = time.perf_counter()
    first: float | None = None
    last = start  # the latest chunk's time: set with `first`, read only once `first` is
    tokens = None
    try:
        resp = await session.post(f"{base}/v1/completions", json=body)
    except aiohttp.ServerDisconnectedError:
        if retry:
            raise _NotAnswered from None
        raise
    async with resp:
        if resp.status != 200:
            raise _refused(base, "/v1/completions", resp.status, await resp.text())
        async for raw in resp.content:
            line = raw.decode("utf-8", "replace").strip()
            if not line.startswith("data:"):
                continue
            payload = line[5:].strip()
            if payload == "[DONE]":
                break
            chunk = json.loads(payload)
            now = time.perf_counter()
            if chunk.get("choices"):
                if first is None:
                    first = now
                last = now
            if chunk.get("usage"):
                tokens = chunk["usage"].get("completion_tokens")
    end = time.perf_counter()
    if first is None:
        raise ProfileError(f"{base}: a streamed completion returned no tokens")
    n = tokens or cfg.output_tokens
    itl = (last - first) / (n - 1) if n > 1 and last > first else None
    return Sample(p, c, first - start, itl, n, start, end)


async def _point(session, base, model, p, c, cfg) -> list[Sample]:
    async def client() -> list[Sample]:
        return [await one_request(session, base, model, p, c, cfg) for _ in range(cfg.requests)]

    per_client = await asyncio.gather(*(client() for _ in range(c)))
    return [s for xs in per_client for s in xs]


async def run_sweep(base: str, cfg: SweepConfig, model: str | None = None, progress=None) -> tuple[str, list[PointResult]]:
    base = base.rstrip("/")
    if base.endswith("/v1"):
        base = base[:-3]
    headers = {"Authorization": f"Bearer {cfg.api_key}"} if cfg.api_key else {}
    async with client_session(cfg.timeout_s, headers) as session:
        model = model or await served_model(session, base)
        await one_request(session, base, model, cfg.prompt_tokens[0], 1, cfg)  # warm-up, not measured
        points = []
        for p in cfg.prompt_tokens:
            for c in cfg.concurrency:
                try:
                    samples = await _point(session, base, model, p, c, cfg)
                except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
                    raise ProfileError(f"request to {base} failed during the sweep (prompt {p}, concurrency {c}): {exc!r}") from None
                itls = [s.itl_s for s in samples if s.itl_s is not None]
                span = max(s.end for s in samples) - min(s.start for s in samples)
                points.append(PointResult(
                    prompt_tokens=p, concurrency=c, ttft_s=statistics.mean(s.ttft_s for s in samples),
                    itl_s=statistics.mean(itls) if itls else float("nan"),
                    e2e_s=statistics.mean(s.end - s.start for s in samples),
                    output_tokens_per_s=sum(s.completion_tokens for s in samples) / span, samples=len(samples),
                ))
                if progress:
                    progress(points[-1])
    return model, points


def observations(points: list[PointResult], output_tokens: int) -> list[Observation]:
    obs = []
    for pt in points:
        c = pt.concurrency
        obs.append(Observation("e2e", c, c * (pt.prompt_tokens + output_tokens / 2.0), pt.e2e_s,
                               prompt_tokens=pt.prompt_tokens, output_tokens=output_tokens))
        if pt.concurrency == 1 and pt.ttft_s > 0:
            obs.append(Observation("ttft", pt.prompt_tokens, 0.0, pt.ttft_s))
    return obs


def profile_entry(model: str, gpu: str, tp: int, pp: int, fit: Fit, points: list[PointResult], endpoint: str) -> dict:
    """One entry of a profiles file (spec `profiles:`, ir/spec.py MeasuredProfile)."""
    top = max(pt.concurrency for pt in points)
    decode = max(pt.output_tokens_per_s for pt in points if pt.concurrency == top)
    return {
        "model": model, "gpu": gpu, "tp": tp, "pp": pp,
        "coefficients": {
            "step_s": fit.step_s, "per_token_s": fit.per_token_s, "per_kv_token_s": fit.per_kv_token_s,
            "request_s": fit.request_s,
        },
        "decode_tokens_per_s": decode,
        "source": f"hetcompile profile {endpoint}: {fit.rows} points, fit rel. RMSE {100 * fit.rel_rmse:.1f}%",
    }


def profile(endpoint: str, model: str, gpu: str, tp: int, pp: int, cfg: SweepConfig, served_name: str | None = None,
            progress=None) -> tuple[dict, Fit, list[PointResult]]:
    _, points = asyncio.run(run_sweep(endpoint, cfg, served_name, progress))
    fit = fit_step_model(observations(points, cfg.output_tokens))
    return profile_entry(model, gpu, tp, pp, fit, points, endpoint), fit, points
