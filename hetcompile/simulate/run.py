"""Replay arrivals through a plan: routing by the plan's weights, each replica an engine model.

Arrivals are either Poisson per workload at `load` x the plan's served rate (theta * lambda_w)
(or in stages of such loads one after the other, `staged_arrivals`),
with every request of a workload at its mean prompt and output lengths, or a JSONL trace, one
request a line: {"t": seconds, "workload": name, "input_tokens": n, "output_tokens": n} (the
lengths default to the workload's means). A request goes to a replica by the router's `weighted`
policy (hetcompile.router.policies.SmoothWRR over the plan's routing weights for its workload).

Measurement: the window is [warmup, duration]; arrivals before `warmup` (10% of duration) warm the
queues up and are not counted. Throughput is completions per second inside the window; latencies
and SLO attainment are over the requests that arrived inside it, followed until they finish (at
most DRAIN_FACTOR x duration more; whatever is left then is counted as a miss). Poisson arrivals
(`steady_arrivals`) go on past the window (LOAD_PAST x duration more, unmeasured) until its last
requests have finished, so those finish under the load the rest saw: a run whose arrivals stop at
the window's end drains, and its last request lifetime of requests is measured on emptying replicas
(helix-highhet42's 20-stage chains, ~400 s a request: TPOT p99 1.6 s in 500 s runs against 2.6 s
over an hour, whose own last 300 s measured 1.1 s against 2.1 s before).
Seeded: the same plan, arrivals and seed give the same simulation.json bytes.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hetcompile.errors import HetcompileError
from hetcompile.plan.doc import PlanDoc
from hetcompile.router.policies import SmoothWRR
from hetcompile.simulate.doc import Percentiles, ReplicaResult, SimulationDoc, WorkloadResult
from hetcompile.simulate.engine import Driver, ReplicaSim, Request

WARMUP_FRACTION = 0.1
DRAIN_FACTOR = 1.0
LOAD_PAST = 1.0  # steady_arrivals: arrivals continue for this share of the duration past the window


class SimulationError(HetcompileError):
    kind = "simulation error"


@dataclass(frozen=True)
class Arrival:
    t: float
    workload: str
    input_tokens: int
    output_tokens: int


def poisson_arrivals(plan: PlanDoc, duration: float, seed: int, load: float = 1.0) -> list[Arrival]:
    """Poisson arrivals per workload at load x served_requests_per_s; one seeded stream per workload,
    by its place in name order (a workload added before another in that order moves its stream)."""
    out: list[Arrival] = []
    for k, w in enumerate(sorted(plan.workloads, key=lambda w: w.name)):
        rate = w.served_requests_per_s * load
        if rate <= 0:
            continue
        rng = np.random.default_rng([seed, k])
        t = 0.0
        # draw in blocks: exponential gaps until past the duration
        while True:
            gaps = rng.exponential(1.0 / rate, size=max(16, int(rate * duration * 0.1) + 16))
            for g in gaps:
                t += float(g)
                if t > duration:
                    break
                out.append(Arrival(t, w.name, max(1, round(w.input_tokens)), max(1, round(w.output_tokens))))
            if t > duration:
                break
    out.sort(key=lambda a: (a.t, a.workload))
    return out


def steady_arrivals(plan: PlanDoc, duration: float, seed: int, load: float = 1.0) -> list[Arrival]:
    """poisson_arrivals that go on past `duration` (LOAD_PAST x duration more; module docstring):
    the same arrivals up to `duration`, then more of the same stream, which replay simulates only
    until the requests up to `duration` have finished."""
    return poisson_arrivals(plan, duration * (1.0 + LOAD_PAST), seed, load)


def staged_arrivals(plan: PlanDoc, stages: list[tuple[float, float]], seed: int) -> list[Arrival]:
    """A load that changes over time: stages [(load, seconds), ...] one after the other, each
    Poisson at load x the plan's served rates (poisson_arrivals, its own seeded stream per stage);
    the last stage goes on past the end (steady_arrivals) so the last requests finish under it."""
    out: list[Arrival] = []
    start = 0.0
    for k, (load, seconds) in enumerate(stages):
        last = k == len(stages) - 1
        span = seconds * (1.0 + LOAD_PAST) if last else seconds
        out += [Arrival(a.t + start, a.workload, a.input_tokens, a.output_tokens)
                for a in poisson_arrivals(plan, span, seed + 1000 * k, load)]
        start += seconds
    out.sort(key=lambda a: (a.t, a.workload))
    return out


def trace_arrivals(plan: PlanDoc, path: Path) -> list[Arrival]:
    """A JSONL trace (module docstring); errors name the line."""
    by_name = {w.name: w for w in plan.workloads}
    out: list[Arrival] = []
    try:
        lines = Path(path).read_text().splitlines()
    except OSError as exc:
        raise SimulationError(f"cannot read trace {str(path)!r}: {exc.strerror or exc}") from None
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{path}:{i}"
        try:
            rec = json.loads(line)
        except ValueError as exc:
            raise SimulationError(f"{where}: not JSON: {exc}") from None
        if not isinstance(rec, dict) or "t" not in rec or "workload" not in rec:
            raise SimulationError(f"{where}: each line needs 't' (seconds) and 'workload'")
        w = by_name.get(rec["workload"])
        if w is None:
            from hetcompile.errors import did_you_mean

            guess = did_you_mean(str(rec["workload"]), sorted(by_name))
            raise SimulationError(f"{where}: unknown workload {rec['workload']!r}" + (f"; did you mean {guess!r}?" if guess else ""))
        try:
            t = float(rec["t"])
            inp = int(rec.get("input_tokens", round(w.input_tokens)))
            outp = int(rec.get("output_tokens", round(w.output_tokens)))
        except (TypeError, ValueError):
            raise SimulationError(f"{where}: t, input_tokens and output_tokens must be numbers") from None
        if t < 0 or inp < 1 or outp < 1:
            raise SimulationError(f"{where}: t must be >= 0 and token counts >= 1")
        out.append(Arrival(t, w.name, inp, outp))
    out.sort(key=lambda a: (a.t, a.workload))
    return out


def _pct(values: list[float]) -> Percentiles:
    if not values:
        return Percentiles()
    a = np.asarray(values)
    p50, p90, p95, p99 = (float(x) for x in np.percentile(a, [50, 90, 95, 99]))
    return Percentiles(p50=p50, p90=p90, p95=p95, p99=p99)


def replica_sims(plan: PlanDoc) -> list[ReplicaSim]:
    sims = []
    for r in plan.replicas:
        if r.step_model is None:
            raise SimulationError(
                f"replica {r.id} has no step model (a mixed pipeline placed from layer profiles); the simulator cannot replay it",
                hint="simulate plans whose replicas carry `step_model` in plan.json",
            )
        sims.append(ReplicaSim(r.id, r.step_model.model()))
    return sims


def replay(plan: PlanDoc, arrivals: list[Arrival], duration: float) -> tuple[list[Request], list[ReplicaSim]]:
    """Every request of `arrivals` through the plan's routing and replicas, run until those that
    arrived by `duration` have finished or `DRAIN_FACTOR` x duration more has passed (later
    arrivals only keep the load on, module docstring); the requests in arrival order, and the
    replicas with their counters."""
    sims = replica_sims(plan)
    for s in sims:
        s.measure_until = duration
    ids = [s.id for s in sims]
    pickers: dict[str, tuple[SmoothWRR, list[str]]] = {}
    shared: dict[tuple, SmoothWRR] = {}  # one sequence per weight vector, as the router shares it (router/table.py)
    for w, weights in plan.routing.items():
        reps = sorted((r for r, x in weights.items() if x > 0 and r in ids))
        if reps:
            key = (tuple(reps), tuple(weights[r] for r in reps))
            pickers[w] = (shared.setdefault(key, SmoothWRR(list(key[1]))), reps)
    driver = Driver(sims)
    requests: list[Request] = []
    unrouted = sorted({a.workload for a in arrivals if a.workload not in pickers})
    if unrouted:
        raise SimulationError(f"the plan routes no replica for workload(s) {', '.join(unrouted)}")
    # a disaggregated group (simulate/disagg.py has the flow): a request routed to one of its decode
    # replicas is first a one-token request on one of its prefill replicas (smooth WRR by the group's
    # prefill weights), then crosses the link for transfer_s, then arrives at the decode replica with
    # its prompt's KV in place (`cached`); TTFT counts from its arrival at the prefill side
    group_of = {d: g for g in plan.groups or () for d in g.decode}
    prefill_picker = {g.id: (SmoothWRR([g.prefill[p] for p in sorted(g.prefill)]), sorted(g.prefill)) for g in plan.groups or ()}
    firsts: dict[int, tuple[str, Request, float]] = {}  # a prefill's request id -> (decode replica, client, transfer)

    def arrive(a: Arrival) -> None:
        picker, reps = pickers[a.workload]
        i = picker.pick(range(len(reps)))
        assert i is not None  # every routed replica is eligible: the weights are positive
        rep = reps[i]
        g = group_of.get(rep)
        req = Request(len(requests), a.workload, a.t, a.input_tokens, a.output_tokens,
                      cached=a.input_tokens if g is not None else 0)
        requests.append(req)
        if g is None:
            driver.arrive(rep, req)
            return
        pick, pre = prefill_picker[g.id]
        j = pick.pick(range(len(pre)))
        assert j is not None
        first = Request(-len(requests), a.workload, a.t, a.input_tokens, 1)  # negative ids: never a client's
        firsts[first.id] = (rep, req, g.transfer_s)
        req.prefilled_on = pre[j]
        driver.arrive(pre[j], first)

    for a in arrivals:
        driver.loop.at(a.t, arrive, a)
    total = sum(1 for a in arrivals if a.t <= duration)
    finished = [0]

    def done(r: Request) -> None:
        if r.id in firsts:  # a prefill finished: its KV moves to the decode replica
            rep, client, transfer = firsts.pop(r.id)
            driver.at_from_step(driver.loop.now + transfer, driver.arrive, rep, client)
            return
        if r.arrival <= duration:
            finished[0] += 1

    driver.on_done = done
    driver.loop.run(duration * (1.0 + DRAIN_FACTOR), stop=lambda: finished[0] >= total)
    return requests, sims


def by_workload(requests: list[Request]) -> dict[str, list[Request]]:
    """The requests of each workload, in their order: per-workload statistics read their own list
    (a plan of thousands of workloads must not scan every request once per workload)."""
    out: dict[str, list[Request]] = {}
    for r in requests:
        out.setdefault(r.workload, []).append(r)
    return out


def measured(requests: list[Request], workload: str, warmup: float, duration: float) -> list[Request]:
    """The workload's requests that arrived inside the measured window [warmup, duration]."""
    return [r for r in requests if r.workload == workload and warmup <= r.arrival <= duration]


def ttft_of(r: Request) -> float:
    """Time to first token (inf: never got one before the drain ended)."""
    return r.first_token - r.arrival if r.first_token is not None else math.inf


def finished_at(r: Request) -> float:
    """When the request finished (inf: it had not when the drain ended)."""
    return r.finish if r.finish is not None else math.inf


def tpot_of(r: Request) -> float | None:
    """Time per output token after the first (None: one output token; inf: unfinished)."""
    if r.output_tokens <= 1:
        return None
    if r.finish is None or r.first_token is None:
        return math.inf
    return (r.finish - r.first_token) / (r.output_tokens - 1)


def within(r: Request, ttft_s: float | None, tpot_s: float | None) -> bool:
    """Finished within every given target."""
    if r.finish is None:
        return False
    if ttft_s is not None and ttft_of(r) > ttft_s:
        return False
    t = tpot_of(r)
    return tpot_s is None or t is None or t <= tpot_s


def simulate(plan: PlanDoc, arrivals: list[Arrival], duration: float, *, seed: int = 0, load: float = 1.0,
             arrivals_name: str = "poisson", warmup: float | None = None) -> SimulationDoc:
    warmup = duration * WARMUP_FRACTION if warmup is None else warmup
    requests, sims = replay(plan, arrivals, duration)
    return summarize(plan, requests, sims, duration, warmup, seed=seed, load=load, arrivals_name=arrivals_name)


def summarize(plan: PlanDoc, requests: list[Request], sims: list[ReplicaSim], duration: float, warmup: float, *,
              seed: int = 0, load: float = 1.0, arrivals_name: str = "poisson") -> SimulationDoc:
    """simulation.json of a replay (module docstring's measurement)."""
    window = max(duration - warmup, 1e-9)
    results = []
    mine = by_workload(requests)
    for w in sorted(plan.workloads, key=lambda w: w.name):
        inside = measured(mine.get(w.name, []), w.name, warmup, duration)
        done_in_window = [r for r in mine.get(w.name, []) if r.finish is not None and warmup <= r.finish <= duration]
        ttft = [ttft_of(r) for r in inside if r.first_token is not None]
        tpot = [t for r in inside if r.finish is not None and (t := tpot_of(r)) is not None]
        slo = w.slo
        att = None
        if slo is not None and (slo.ttft_s is not None or slo.tpot_s is not None):
            att = sum(within(r, slo.ttft_s, slo.tpot_s) for r in inside) / len(inside) if inside else None
        results.append(WorkloadResult(
            name=w.name, planned_requests_per_s=w.served_requests_per_s,
            offered_requests_per_s=len(inside) / window, arrived=len(inside),
            completed=sum(1 for r in inside if r.finish is not None),
            throughput_requests_per_s=len(done_in_window) / window,
            output_tokens_per_s=sum(r.output_tokens for r in done_in_window) / window,
            ttft_s=_pct(ttft), tpot_s=_pct(tpot),
            slo_ttft_s=slo.ttft_s if slo else None, slo_tpot_s=slo.tpot_s if slo else None, slo_attainment=att,
        ))
    busy = replica_load(plan, requests, warmup, duration)
    reps = [ReplicaResult(id=s.id, completed=s.completed, preemptions=s.preemptions, steps=s.steps,
                          mean_step_tokens=s.step_tokens / s.steps if s.steps else 0.0,
                          utilization=busy.get(s.id, 0.0), stepping=min(1.0, s.busy_s / duration)) for s in sims]
    return SimulationDoc(
        plan=plan.plan, spec_hash=plan.spec_hash, arrivals=arrivals_name, load=load, seed=seed, policy="weighted",
        duration_s=duration, warmup_s=warmup, workloads=tuple(results), replicas=tuple(reps),
        # requests that arrived after the window only keep the load on; the run stops without them
        unfinished=sum(1 for r in requests if r.finish is None and r.arrival <= duration),
    )


def replica_load(plan: PlanDoc, requests: list[Request], warmup: float, duration: float) -> dict[str, float]:
    """U_r as plan.md and explain count it (PlanReplica.load), at the served rates: the requests r
    completed in [warmup, duration] per second, per workload."""
    window = max(duration - warmup, 1e-9)
    done: dict[str, dict[str, int]] = {}
    for r in requests:
        if r.finish is not None and warmup <= r.finish <= duration:
            # a group's request counts on its decode replica and on the prefill replica that ran its prompt
            for rep in (r.replica, r.prefilled_on) if r.prefilled_on else (r.replica,):
                mine = done.setdefault(rep, {})
                mine[r.workload] = mine.get(r.workload, 0) + 1
    return {rep.id: rep.load({w: n / window for w, n in sorted(done.get(rep.id, {}).items())}) for rep in plan.replicas}


def _one_replica(rm, input_tokens: int, output_tokens: int, rate: float, duration: float, seed: int,
                 until: float, spread: float = 0.0) -> list[Request]:
    """One replica offered Poisson arrivals of one workload alone at `rate` for `duration` seconds,
    run until `until`; every request, in arrival order. `spread` > 0: output lengths uniform on
    [O (1 - spread), O (1 + spread)] (a second seeded stream, so the arrival times stay the same)."""
    driver = Driver([ReplicaSim("r", rm)])
    rng = np.random.default_rng(seed)
    lengths = np.random.default_rng([seed, 1]) if spread > 0 else None
    lo, hi = max(1, round(output_tokens * (1.0 - spread))), max(1, round(output_tokens * (1.0 + spread)))
    t = 0.0
    reqs: list[Request] = []
    while True:
        t += float(rng.exponential(1.0 / rate))
        if t > duration:
            break
        out = int(lengths.integers(lo, hi + 1)) if lengths is not None else output_tokens
        req = Request(len(reqs), "w", t, input_tokens, out)
        reqs.append(req)
        driver.loop.at(t, driver.arrive, "r", req)
    driver.loop.run(until)
    return reqs


def mix_requests(rm, mix: list[tuple[float, int, int]], duration: float, seed: int = 0) -> list[Request]:
    """One replica under Poisson arrivals of several workloads at once, `mix` = [(rate, I, O), ...]
    (a seeded stream each): the requests that arrived in [0.2 duration, duration] (after the
    warm-up), each run to its end while arrivals go on (LOAD_PAST: the last measured requests finish
    under the same load, not in an emptying engine)."""
    driver = Driver([ReplicaSim("r", rm)])
    arrivals: list[tuple[float, int, int]] = []
    for k, (rate, I, O) in enumerate(mix):
        rng, t = np.random.default_rng([seed, k]), 0.0
        while rate > 0:
            t += float(rng.exponential(1.0 / rate))
            if t > duration * (1.0 + LOAD_PAST):
                break
            arrivals.append((t, I, O))
    reqs: list[Request] = []
    for t, I, O in sorted(arrivals):
        req = Request(len(reqs), "w", t, I, O)
        reqs.append(req)
        driver.loop.at(t, driver.arrive, "r", req)
    measured = [r for r in reqs if 0.2 * duration <= r.arrival <= duration]
    left = [len(measured)]

    def done(r: Request) -> None:
        if 0.2 * duration <= r.arrival <= duration:
            left[0] -= 1

    driver.on_done = done
    driver.loop.run(math.inf, stop=lambda: left[0] <= 0)
    return [r for r in measured if r.finish is not None]


def saturation_throughput(rm, input_tokens: int, output_tokens: int, rate: float, duration: float, seed: int = 0,
                          spread: float = 0.0) -> float:
    """Requests/s one replica completes under Poisson arrivals at `rate` (above its capacity) for
    one workload alone: the simulator's side of the capacity check (perf/capacity.py's h_{c,w}).
    With `spread` (output lengths varying about O, _one_replica) it is output tokens/s over O, so
    that the lengths drawn do not count as a change of capacity."""
    warmup = duration * 0.3
    reqs = _one_replica(rm, input_tokens, output_tokens, rate, duration, seed, until=duration, spread=spread)
    done = [r for r in reqs if r.finish is not None and warmup <= r.finish <= duration]
    if spread > 0:
        return sum(r.output_tokens for r in done) / output_tokens / (duration - warmup)
    return len(done) / (duration - warmup)


def poisson_requests(rm, input_tokens: int, output_tokens: int, rate: float, duration: float, seed: int = 0) -> list[Request]:
    """One replica under Poisson arrivals at `rate` (below its capacity) for one workload alone,
    run until every request finishes; the requests that arrived after the first 20% (warm-up)."""
    reqs = _one_replica(rm, input_tokens, output_tokens, rate, duration, seed, until=math.inf)
    return [r for r in reqs if r.arrival >= 0.2 * duration and r.finish is not None]
