"""Benchmark load on one replica: the three ways published vLLM numbers are measured, replayed.

A measurement is only comparable with a prediction made at the measurement's own load, so the
simulator (engine.py) is driven the way the benchmark drove the server:

- `closed_loop(m, c, n)`: c clients (vllm bench serve --max-concurrency c, llmperf, AccelMark
  interactive/sustained); each sends its next request when its previous one finishes, n requests in all;
- `open_loop(m, rate, n, seed)`: n requests with Poisson arrivals at `rate` req/s (vllm bench serve
  --request-rate), seeded;
- `burst(m, n)`: n requests at t = 0 (request rate inf with no concurrency cap, LLM.generate,
  benchmark_throughput, benchmark_latency's static batch).

Request lengths: `lengths(n, I, O, spread, seed)` gives n (input, output) pairs with means I and O;
spread 0 is the fixed-length random dataset, spread s draws each length uniformly in
[(1 - s) x mean, (1 + s) x mean] (ShareGPT-like traffic, whose varied lengths keep closed-loop
clients from moving in lock-step waves), rescaled so the means are exactly I and O. Open-loop
arrivals are Poisson gaps rescaled to span exactly (n - 1) / rate: both remove the draw's own
sampling error (a seeded draw of 200 arrivals at 1 req/s spans 225 s, not 199 s), so a row is
predicted at its nominal load.

`LoadResult` holds what `vllm bench serve` prints: output tokens per second over the whole run
(first arrival to last completion), and the medians over requests of TTFT (arrival to first token),
TPOT ((finish - first token) / (output - 1), requests with output > 1) and ITL (the mean gap between
tokens over all tokens, as vLLM's ITL median over gaps is for a smooth stream).
`prefill_first` replays vLLM's V0 scheduling (engine.ReplicaSim). Deterministic: the same arguments
give the same result.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

import numpy as np

from hetcompile.perf.stepmodel import ReplicaModel
from hetcompile.simulate.engine import Driver, ReplicaSim, Request


@dataclass(frozen=True)
class LoadResult:
    throughput: float  # output tokens/s over the run
    ttft_s: float  # median
    tpot_s: float  # median
    duration_s: float
    completed: int
    ttft_mean_s: float = 0.0  # mean over requests
    itl_mean_s: float = 0.0  # mean over every inter-token gap of every request (vllm bench serve's mean ITL)
    e2e_mean_s: float = 0.0  # mean arrival-to-last-token latency


def lengths(n: int, input_tokens: float, output_tokens: float, spread: float, seed: int = 0) -> list[tuple[int, int]]:
    """n (input, output) pairs with means input_tokens, output_tokens (module docstring)."""
    if spread <= 0:
        return [(max(1, round(input_tokens)), max(1, round(output_tokens)))] * n
    rng = np.random.default_rng(seed)
    u = rng.uniform(1 - spread, 1 + spread, size=(n, 2))
    u /= u.mean(axis=0)  # the draw's means are exactly the row's: a prediction at its load, not at a draw's
    return [(max(1, round(input_tokens * a)), max(1, round(output_tokens * b))) for a, b in u]


def poisson_times(n: int, rate: float, seed: int = 0) -> list[float]:
    """n Poisson arrival times at `rate` req/s, the first at t = 0, the exponential gaps rescaled so
    the arrivals span exactly (n - 1) / rate: the load the caller asked for, not a draw's (200
    seeded gaps at 1 req/s span 225 s, not 199 s; seed 0's first 13 gaps are 40% long)."""
    gaps = np.random.default_rng(seed).exponential(1.0 / rate, size=n)
    times = np.concatenate([[0.0], np.cumsum(gaps[1:])])
    if n > 1:
        times *= (n - 1) / rate / times[-1]
    return [float(t) for t in times]


def staged_times(stages: list[tuple[float, float]], seed: int = 0, poisson: bool = True) -> list[float]:
    """Arrival times of a load in stages [(rate req/s, seconds), ...], one after the other (a
    benchmark that runs 8 req/s for 600 s, then 20 req/s for 600 s): each stage round(rate x
    seconds) arrivals over its span, Poisson (poisson_times, rescaled to the stage's rate) or evenly
    spaced (a constant-rate client). Each stage draws its own seeded stream."""
    out: list[float] = []
    start = 0.0
    for k, (rate, seconds) in enumerate(stages):
        n = max(1, round(rate * seconds))
        ts = poisson_times(n, rate, seed + k) if poisson else [i / rate for i in range(n)]
        out += [start + t for t in ts]
        start += seconds
    return out


def _result(reqs: list[Request], end: float) -> LoadResult:
    # (arrival, first token, finish, output tokens) of each finished request (a finished one has its first token)
    done = [(r.arrival, r.first_token, r.finish, r.output_tokens) for r in reqs
            if r.finish is not None and r.first_token is not None]
    if not done:
        return LoadResult(0.0, float("inf"), float("inf"), end, 0)
    start = min(r.arrival for r in reqs)
    last = max(f for _, _, f, _ in done)
    tokens = sum(n for *_, n in done)
    ttft = statistics.median(t - a for a, t, _, _ in done)
    streams = [(t, f, n) for _, t, f, n in done if n > 1]
    gaps = [(f - t) / (n - 1) for t, f, n in streams]
    tpot = statistics.median(gaps) if gaps else 0.0
    itl = (sum(f - t for t, f, _ in streams) / sum(n - 1 for *_, n in streams)) if streams else 0.0
    return LoadResult(tokens / max(last - start, 1e-9), ttft, tpot, last - start, len(done),
                      ttft_mean_s=statistics.fmean(t - a for a, t, _, _ in done), itl_mean_s=itl,
                      e2e_mean_s=statistics.fmean(f - a for a, _, f, _ in done))


def _run(model: ReplicaModel, schedule, n: int, on_done=None, prefill_first: bool = False) -> tuple[Driver, list[Request]]:
    sim = ReplicaSim("r", model, prefill_first=prefill_first)
    reqs: list[Request] = []
    drv = Driver([sim], on_done=on_done)
    schedule(drv, reqs)
    drv.loop.run(float("inf"), stop=lambda: sim.completed >= n)
    return drv, reqs


def closed_loop(model: ReplicaModel, c: int, pairs: list[tuple[int, int]], prefill_first: bool = False) -> LoadResult:
    """len(pairs) requests from c clients that each send the next one when theirs finishes."""
    queue = list(enumerate(pairs))
    queue.reverse()
    reqs: list[Request] = []
    holder: dict = {}

    def send(drv: Driver) -> None:
        i, (inp, out) = queue.pop()
        r = Request(i, "w", drv.loop.now, inp, out)
        reqs.append(r)
        drv.arrive("r", r)

    def on_done(_r: Request) -> None:
        if queue:
            send(holder["drv"])

    def schedule(drv: Driver, _reqs: list[Request]) -> None:
        holder["drv"] = drv
        for _ in range(min(c, len(queue))):
            send(drv)

    drv, _ = _run(model, schedule, len(pairs), on_done, prefill_first)
    return _result(reqs, drv.loop.now)


def open_loop(model: ReplicaModel, rate: float, pairs: list[tuple[int, int]], seed: int = 0,
              prefill_first: bool = False, times: list[float] | None = None,
              cached: int | list[int] = 0) -> LoadResult:
    """len(pairs) requests with Poisson arrivals at `rate` req/s (the first at t = 0), or at `times`
    (e.g. staged_times); `cached`: prompt tokens each request finds in the prefix cache (one number
    for all, or one per request)."""
    times = poisson_times(len(pairs), rate, seed) if times is None else times
    hits = cached if isinstance(cached, list) else [cached] * len(pairs)
    reqs = [Request(i, "w", float(t), inp, out, cached=c)
            for i, (t, (inp, out), c) in enumerate(zip(times, pairs, hits))]

    def schedule(drv: Driver, _reqs: list[Request]) -> None:
        for r in reqs:
            drv.loop.at(r.arrival, drv.arrive, "r", r)

    drv, _ = _run(model, schedule, len(pairs), prefill_first=prefill_first)
    return _result(reqs, drv.loop.now)


def burst(model: ReplicaModel, pairs: list[tuple[int, int]], prefill_first: bool = False) -> LoadResult:
    """len(pairs) requests all arriving at t = 0."""
    reqs = [Request(i, "w", 0.0, inp, out) for i, (inp, out) in enumerate(pairs)]

    def schedule(drv: Driver, _reqs: list[Request]) -> None:
        for r in reqs:
            drv.arrive("r", r)

    drv, _ = _run(model, schedule, len(pairs), prefill_first=prefill_first)
    return _result(reqs, drv.loop.now)
