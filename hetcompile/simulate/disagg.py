"""A disaggregated group in the simulator: prefill replicas, the KV transfer, decode replicas (issue 35).

The same engine model as every replica (simulate/engine.py), with the two phases vLLM's P/D runs:

- a request's arrival goes to a prefill replica (round robin over the group's prefill replicas: the
  router's smooth WRR at equal weights) as a request of one output token: the frontend's overhead,
  the prompt's chunks in the prefill engine's steps, and the one token it samples (the router
  drops it);
- when that finishes, its KV is on the wire for `transfer_s` (perf/disagg.kv_transfer_s);
- then the decode replica (round robin over the decode replicas) gets the request as vLLM's decode
  instance does: a second frontend overhead (the router's second request), the prompt's KV
  already in place (`cached` = the whole prompt: the engine computes the one token vLLM's prefix
  cache never serves), and every output token. TTFT is the decode side's first token against the
  request's arrival at the prefill side; TPOT is the decode side's.

KV on the decode replica is held from its admission, as vLLM allocates the blocks the transfer
writes into; the decode replica's `max_num_seqs` is its C* (perf/disagg.decode_capacity).
Deterministic: seeded arrivals, ties broken by the event loop's sequence numbers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from hetcompile.perf.stepmodel import ReplicaModel
from hetcompile.simulate.engine import Driver, ReplicaSim, Request
from hetcompile.simulate.run import tpot_of, ttft_of


@dataclass(frozen=True)
class GroupRun:
    """What a replay of one group measured: the requests that arrived in the measured window."""

    ttft_s: tuple[float, ...]  # per measured request (inf: no first token before the run ended)
    tpot_s: tuple[float, ...]
    arrived: int
    completed: int
    duration_s: float

    def quantile(self, values: tuple[float, ...], q: float) -> float:
        return float(np.quantile(np.asarray(values), q)) if values else math.nan


def replay_group(rm_p: ReplicaModel, rm_d: ReplicaModel, n_prefill: int, n_decode: int, input_tokens: int,
                 output_tokens: int, rate: float, transfer_s: float, duration: float, seed: int = 0,
                 warmup: float | None = None, decode_runs: bool = True) -> GroupRun:
    """n_prefill + n_decode replicas of one group offered Poisson arrivals at `rate` for `duration`
    seconds (module docstring); the requests that arrived after `warmup` (default 20% of the run)
    are measured, each run to its end while later arrivals keep the load on. `decode_runs=False`:
    every step an event (the reference the engine's decode runs are checked against)."""
    warmup = 0.2 * duration if warmup is None else warmup
    prefill = [ReplicaSim(f"p{i}", rm_p) for i in range(n_prefill)]
    decode = [ReplicaSim(f"d{i}", rm_d) for i in range(n_decode)]
    driver = Driver(prefill + decode, decode_runs=decode_runs)
    rng = np.random.default_rng(seed)
    turn = {"p": 0, "d": 0}
    firsts: dict[int, Request] = {}  # the prefill request -> the client's request (decode side)
    measured: list[Request] = []
    left = [0]

    def to_decode(first: Request) -> None:
        req = firsts.pop(first.id)
        rid = decode[turn["d"] % n_decode].id
        turn["d"] += 1
        driver.arrive(rid, req)

    def done(r: Request) -> None:
        if r.id in firsts:  # a prefill finished: its KV crosses the link, then the decode side starts
            driver.at_from_step(driver.loop.now + transfer_s, to_decode, r)
        elif warmup <= r.arrival <= duration:
            left[0] -= 1

    driver.on_done = done
    t, n = 0.0, 0
    while True:
        t += float(rng.exponential(1.0 / rate))
        if t > duration * 1.2:  # arrivals go on past the window so its last requests finish under load
            break
        client = Request(2 * n + 1, "w", t, input_tokens, output_tokens, cached=input_tokens)
        first = Request(2 * n, "w", t, input_tokens, 1)
        firsts[first.id] = client
        if warmup <= t <= duration:
            measured.append(client)
            left[0] += 1
        driver.loop.at(t, driver.arrive, prefill[turn["p"] % n_prefill].id, first)
        turn["p"] += 1
        n += 1
    driver.loop.run(math.inf, stop=lambda: left[0] <= 0)
    ttft = tuple(ttft_of(r) for r in measured)
    tpot = tuple(x for r in measured if (x := tpot_of(r)) is not None)
    return GroupRun(ttft, tpot, len(measured), sum(1 for r in measured if r.finish is not None), duration)


def replay_replicas(rm: ReplicaModel, n: int, input_tokens: int, output_tokens: int, rate: float, duration: float,
                    seed: int = 0, warmup: float | None = None) -> GroupRun:
    """The aggregated comparison: n replicas of one model (round robin) offered the same arrivals."""
    warmup = 0.2 * duration if warmup is None else warmup
    sims = [ReplicaSim(f"r{i}", rm) for i in range(n)]
    driver = Driver(sims)
    rng = np.random.default_rng(seed)
    measured: list[Request] = []
    left = [0]

    def done(r: Request) -> None:
        if warmup <= r.arrival <= duration:
            left[0] -= 1

    driver.on_done = done
    t, k = 0.0, 0
    while True:
        t += float(rng.exponential(1.0 / rate))
        if t > duration * 1.2:
            break
        req = Request(k, "w", t, input_tokens, output_tokens)
        if warmup <= t <= duration:
            measured.append(req)
            left[0] += 1
        driver.loop.at(t, driver.arrive, sims[k % n].id, req)
        k += 1
    driver.loop.run(math.inf, stop=lambda: left[0] <= 0)
    ttft = tuple(ttft_of(r) for r in measured)
    tpot = tuple(x for r in measured if (x := tpot_of(r)) is not None)
    return GroupRun(ttft, tpot, len(measured), sum(1 for r in measured if r.finish is not None), duration)
