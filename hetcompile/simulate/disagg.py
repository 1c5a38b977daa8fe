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


LOAD_PAST = 0.2  # arrivals go on for this share of the duration past the window: its last requests finish under load


def _arrivals(rate: float, duration: float, seed: int) -> list[float]:
    """Poisson arrival times at `rate` until (1 + LOAD_PAST) x duration."""
    rng, t = np.random.default_rng(seed), 0.0
    out: list[float] = []
    while True:
        t += float(rng.exponential(1.0 / rate))
        if t > duration * (1.0 + LOAD_PAST):
            return out
        out.append(t)


def _measure(driver: Driver, clients: list[Request], warmup: float, duration: float, hand_on=None) -> GroupRun:
    """Run until every client request that arrived in [warmup, duration] has finished; `hand_on(r)`
    takes a finished request that is not a client's (a prefill's) and says so."""
    measured = [r for r in clients if warmup <= r.arrival <= duration]
    left = [len(measured)]

    def done(r: Request) -> None:
        if hand_on is not None and hand_on(r):
            return
        if warmup <= r.arrival <= duration:
            left[0] -= 1

    driver.on_done = done
    driver.loop.run(math.inf, stop=lambda: left[0] <= 0)
    ttft = tuple(ttft_of(r) for r in measured)
    tpot = tuple(x for r in measured if (x := tpot_of(r)) is not None)
    return GroupRun(ttft, tpot, len(measured), sum(1 for r in measured if r.finish is not None), duration)


def replay_group(rm_p: ReplicaModel, rm_d: ReplicaModel, n_prefill: int, n_decode: int, input_tokens: int,
                 output_tokens: int, rate: float, transfer_s: float, duration: float, seed: int = 0,
                 warmup: float | None = None, decode_runs: bool = True) -> GroupRun:
    """n_prefill + n_decode replicas of one group offered Poisson arrivals at `rate` for `duration`
    seconds (module docstring); the requests that arrived after `warmup` (default 20% of the run)
    are measured, each run to its end while later arrivals keep the load on. `decode_runs=False`:
    every step an event (the reference the engine's decode runs are checked against)."""
    prefill = [ReplicaSim(f"p{i}", rm_p) for i in range(n_prefill)]
    decode = [ReplicaSim(f"d{i}", rm_d) for i in range(n_decode)]
    driver = Driver(prefill + decode, decode_runs=decode_runs)
    firsts: dict[int, Request] = {}  # the prefill request -> the client's request (decode side)
    handed = [0]

    def to_decode(first: Request) -> None:
        driver.arrive(decode[handed[0] % n_decode].id, firsts.pop(first.id))
        handed[0] += 1

    def hand_on(r: Request) -> bool:
        if r.id not in firsts:
            return False
        driver.at_from_step(driver.loop.now + transfer_s, to_decode, r)  # its KV crosses the link first
        return True

    clients: list[Request] = []
    for n, t in enumerate(_arrivals(rate, duration, seed)):
        client = Request(2 * n + 1, "w", t, input_tokens, output_tokens, cached=input_tokens)
        first = Request(2 * n, "w", t, input_tokens, 1)
        firsts[first.id] = client
        clients.append(client)
        driver.loop.at(t, driver.arrive, prefill[n % n_prefill].id, first)
    return _measure(driver, clients, 0.2 * duration if warmup is None else warmup, duration, hand_on)


def replay_replicas(rm: ReplicaModel, n: int, input_tokens: int, output_tokens: int, rate: float, duration: float,
                    seed: int = 0, warmup: float | None = None) -> GroupRun:
    """The aggregated comparison: n replicas of one model (round robin) offered the same arrivals."""
    sims = [ReplicaSim(f"r{i}", rm) for i in range(n)]
    driver = Driver(sims)
    clients: list[Request] = []
    for k, t in enumerate(_arrivals(rate, duration, seed)):
        clients.append(Request(k, "w", t, input_tokens, output_tokens))
        driver.loop.at(t, driver.arrive, sims[k % n].id, clients[-1])
    return _measure(driver, clients, 0.2 * duration if warmup is None else warmup, duration)
