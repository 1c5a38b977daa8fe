"""The build's check of a plan by simulation (issue 18, item 2): replay it at its planned load.

A plan with SLOs is replayed with Poisson arrivals at its own served rates through its replicas
and routing weights (simulate/run.py), seeded and bounded by work, not wall-clock time:

    n_w       = max(VERIFY_REQUESTS, 2 x requests_for_quantile(q_w)) measured requests of every SLO
                workload w (simulate/tail.py: a q-quantile needs 10 / (1 - q) requests; twice that,
                20 beyond a p99, keeps the estimate within about the true p98.6..p99.3)
    window    = max_w n_w / lambda_w                 seconds of arrivals measured
    warm-up   = RELAXATIONS x the slowest replica's relaxation time at its planned utilization
                (simulate/tail.py), so the queues have settled before the measurement starts
    work      : at most VERIFY_MAX_REQUESTS arrivals in all; a longer run shrinks the window first

A workload meets its SLO when its simulated q-quantile of TTFT and of TPOT are within the targets.
Where one misses, `tighten` says how much less load its replicas may take (the ratio target /
simulated, at least TIGHTEN_MIN and at most TIGHTEN_MAX of the load per round); the driver re-solves
with that factor and replays again, for at most MAX_ROUNDS plans.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from hetcompile.perf.tail import PERCENTILES
from hetcompile.plan.doc import PlanDoc, Verification, VerifiedWorkload
from hetcompile.simulate.doc import Percentiles, SimulationDoc
from hetcompile.simulate.run import poisson_arrivals, simulate
from hetcompile.simulate.tail import RELAXATIONS, relaxation_s, requests_for_quantile

VERIFY_SEED = 0
VERIFY_REQUESTS = 2000
VERIFY_MAX_REQUESTS = 40_000
MAX_ROUNDS = 5
TIGHTEN_MIN, TIGHTEN_MAX = 0.5, 0.9


@dataclass(frozen=True)
class Miss:
    """One SLO the simulation did not meet: what it measured against what was asked."""

    workload: str
    what: str  # "TTFT" | "TPOT"
    percentile: str
    simulated_s: float
    target_s: float


def _slo_workloads(plan: PlanDoc):
    return [w for w in plan.workloads if w.slo is not None and (w.slo.ttft_s is not None or w.slo.tpot_s is not None)
            and w.served_requests_per_s > 0]


def planned_warmup(plan: PlanDoc) -> float:
    """RELAXATIONS x the slowest replica's relaxation time at the plan's own load."""
    slowest = 0.0
    served = {w.name: w.served_requests_per_s for w in plan.workloads}
    for r in plan.replicas:
        lam = rho = 0.0
        for w, weights in plan.routing.items():
            total = sum(weights.values())
            rate = served.get(w, 0.0) * weights.get(r.id, 0.0) / total if total > 0 else 0.0
            cap = r.workloads[w].capacity_requests_per_s if w in r.workloads else 0.0
            if rate > 0:
                lam += rate
                rho += rate / cap if cap > 0 else math.inf
        if lam > 0:
            slowest = max(slowest, relaxation_s(rho, lam / rho if rho > 0 else 0.0))
    return RELAXATIONS * slowest


def run_length(plan: PlanDoc) -> tuple[float, float]:
    """(duration, warm-up) of the verification run (module docstring); (0, 0): nothing to verify."""
    slo = _slo_workloads(plan)
    if not slo:
        return 0.0, 0.0
    window = max(max(VERIFY_REQUESTS, 2 * requests_for_quantile(PERCENTILES[w.slo.percentile])) / w.served_requests_per_s
                 for w in slo)
    total = sum(w.served_requests_per_s for w in plan.workloads)
    warmup = planned_warmup(plan)
    cap = VERIFY_MAX_REQUESTS / total
    if math.isinf(warmup) or warmup > cap / 2:
        warmup = cap / 2  # a queue that never settles shows up as a miss anyway
    return min(warmup + window, cap), warmup


def _quantile(p: Percentiles, name: str) -> float | None:
    return getattr(p, name)


def check(plan: PlanDoc, doc: SimulationDoc) -> tuple[list[VerifiedWorkload], list[Miss]]:
    """Each SLO workload's simulated percentiles against its targets."""
    res = {w.name: w for w in doc.workloads}
    out, misses = [], []
    for w in _slo_workloads(plan):
        s, r = w.slo, res[w.name]
        ttft, tpot = _quantile(r.ttft_s, s.percentile), _quantile(r.tpot_s, s.percentile)
        mine = []
        if s.ttft_s is not None and (ttft is None or ttft > s.ttft_s):
            mine.append(Miss(w.name, "TTFT", s.percentile, math.inf if ttft is None else ttft, s.ttft_s))
        if s.tpot_s is not None and (tpot is None or tpot > s.tpot_s):
            mine.append(Miss(w.name, "TPOT", s.percentile, math.inf if tpot is None else tpot, s.tpot_s))
        if r.completed < r.arrived:
            mine.append(Miss(w.name, "TTFT", s.percentile, math.inf, s.ttft_s or math.inf))
        misses += mine
        out.append(VerifiedWorkload(name=w.name, percentile=s.percentile, ttft_s=ttft, tpot_s=tpot,
                                    attainment=r.slo_attainment, met=not mine, factor=1.0))
    return out, misses


def slo_part(plan: PlanDoc) -> PlanDoc:
    """The part of the plan the SLO workloads' latencies depend on: the replicas they are routed to,
    and every workload routed to those (and their replicas, to a fixed point); a replica outside it
    shares no queue with an SLO workload, so leaving it out changes no SLO number and saves its steps."""
    slo = {w.name for w in _slo_workloads(plan)}
    reps: set[str] = set()
    ws = set(slo)
    while True:
        more = {r for w in ws for r, x in plan.routing.get(w, {}).items() if x > 0}
        wider = ws | {w for w, weights in plan.routing.items() if any(weights.get(r, 0) > 0 for r in more)}
        if more <= reps and wider <= ws:
            break
        reps |= more
        ws = wider
    return plan.model_copy(update={
        "replicas": tuple(r for r in plan.replicas if r.id in reps),
        "workloads": tuple(w for w in plan.workloads if w.name in ws),
        "routing": {w: x for w, x in plan.routing.items() if w in ws},
    })


def verify(plan: PlanDoc, seed: int = VERIFY_SEED) -> tuple[SimulationDoc | None, list[VerifiedWorkload], list[Miss]]:
    """Replay the plan's SLO part (slo_part) at its planned load (module docstring); (None, [], [])
    without SLOs."""
    if not _slo_workloads(plan):
        return None, [], []
    plan = slo_part(plan)
    duration, warmup = run_length(plan)
    if duration <= 0:
        return None, [], []
    doc = simulate(plan, poisson_arrivals(plan, duration, seed), duration, seed=seed, warmup=warmup)
    ws, misses = check(plan, doc)
    return doc, ws, misses


def tighten(misses: list[Miss]) -> dict[str, float]:
    """Per workload, the share of its current load to keep: target / simulated of its worst miss,
    within [TIGHTEN_MIN, TIGHTEN_MAX] (latency grows faster than load near saturation, so a ratio
    step is a cautious one, and at least 10% per round keeps the loop short)."""
    out: dict[str, float] = {}
    for m in misses:
        ratio = m.target_s / m.simulated_s if m.simulated_s > 0 and math.isfinite(m.simulated_s) else 0.0
        step = min(TIGHTEN_MAX, max(TIGHTEN_MIN, ratio))
        out[m.workload] = min(out.get(m.workload, 1.0), step)
    return out


def summary(doc: SimulationDoc, ws: list[VerifiedWorkload], rounds: int, factors: dict[str, float]) -> Verification:
    return Verification(
        seed=doc.seed, requests=sum(w.arrived for w in doc.workloads), duration_s=doc.duration_s, warmup_s=doc.warmup_s,
        rounds=rounds, workloads=tuple(w.model_copy(update={"factor": factors.get(w.name, 1.0)}) for w in ws),
    )
