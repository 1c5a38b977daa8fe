"""How long a simulation must run before the p99 it prints means something (issue 18, item 5).

Two things make a short run understate a tail, and each gives a lower bound on `--duration`:

1. Samples. A p-quantile estimated from n requests rests on the n(1 - p) slowest of them. The
   rule: at least TAIL_SAMPLES = 10 requests expected beyond it, i.e. n >= 10 / (1 - p), 1,000
   completed requests per workload for a p99. Why 10: the count of requests beyond the true p99
   is Binomial(n, 0.01); at a mean of 10 its 95% range is about 4 to 16, so the printed p99 lies
   between the true p98.4 and p99.6. A "p99" from 100 requests is the slowest single request.
   The measured window (duration - warm-up) must hold that many arrivals of every workload.

2. Warm-up. The simulation starts with empty queues; the measurement must start after they
   settle. A queue with service capacity h (requests/s) at utilization rho settles with the
   relaxation time tau = 1 / (h (1 - sqrt(rho))^2) (Morse's M/M/1 result, which carries to c
   servers with h their total rate): 0.3 s at rho = 0.5 and h = 10/s, 55 s at rho = 0.9 and
   h = 7/s, ten hours at rho = 0.996 -- why 300 s at the planned load of a plan that runs a
   replica 99.6% busy printed a p99 TTFT of 0.73 s where an hour printed 52 s. The warm-up must
   be at least RELAXATIONS x tau of the slowest-settling replica (the transient decays as
   exp(-t / tau): 3 tau leaves 5% of it). rho and h come from the plan: each replica's offered
   req/s per workload (the offered rate x the routing weights) over its capacity for that
   workload. At rho >= 1 the queue never settles: the p99 grows with the duration. And a
   replica's batch is made of the requests of the last request lifetime, so it settles no faster
   than that: the warm-up is also at least LIFETIMES x the longest lifetime the tail model predicts
   for the plan (p99 TTFT + (O - 1) p99 TPOT; helix-highhet42's ~500 s requests against a 200 s
   queue relaxation).

`tail_advice(plan, doc)` states the duration that satisfies both and warns where the run fell
short; `hetcompile simulate` prints it under the table.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from hetcompile.plan.doc import PlanDoc
from hetcompile.simulate.doc import SimulationDoc

TAIL_QUANTILE = 0.99  # the tail the simulator prints
TAIL_SAMPLES = 10  # requests expected beyond the quantile
RELAXATIONS = 3.0  # warm-up in relaxation times: exp(-3) = 5% of the start-up transient left
LIFETIMES = 2.0  # and in request lifetimes


def requests_for_quantile(q: float = TAIL_QUANTILE) -> int:
    """Completed requests a workload needs for its q-quantile: TAIL_SAMPLES beyond it."""
    return math.ceil(round(TAIL_SAMPLES / (1.0 - q), 6))


def relaxation_s(rho: float, capacity_rps: float) -> float:
    """Time constant with which a queue at utilization `rho` settles (inf at rho >= 1)."""
    if rho >= 1.0 or capacity_rps <= 0:
        return math.inf
    return 1.0 / (capacity_rps * (1.0 - math.sqrt(max(rho, 0.0))) ** 2)


@dataclass(frozen=True)
class ReplicaLoad:
    id: str
    rho: float  # offered load over capacity, summed over its workloads
    capacity_rps: float  # h for its offered mix

    @property
    def relaxation_s(self) -> float:
        return relaxation_s(self.rho, self.capacity_rps)


def offered_rates(doc: SimulationDoc) -> dict[str, float]:
    """Req/s offered per workload: Poisson arrivals at load x the planned rate (the window's count
    only samples it: at a plan sized to capacity that noise alone would read as rho > 1); a trace
    at what arrived in the window."""
    poisson = doc.arrivals == "poisson"
    return {w.name: w.planned_requests_per_s * doc.load if poisson else w.offered_requests_per_s for w in doc.workloads}


def replica_loads(plan: PlanDoc, offered: dict[str, float]) -> list[ReplicaLoad]:
    """rho and h per replica from the offered req/s per workload, the routing weights and the
    plan's capacities."""
    loads = []
    for r in plan.replicas:
        lam = rho = 0.0
        for w, weights in plan.routing.items():
            rate = offered.get(w, 0.0) * weights.get(r.id, 0.0)
            cap = r.workloads[w].capacity_requests_per_s if w in r.workloads else 0.0
            if rate <= 0:
                continue
            lam += rate
            rho += rate / cap if cap > 0 else math.inf
        if lam > 0:
            loads.append(ReplicaLoad(r.id, rho, lam / rho if rho > 0 else 0.0))
    return loads


def lifetime_s(plan: PlanDoc) -> float:
    """The longest request lifetime the tail model predicts: p99 TTFT + (O - 1) p99 TPOT."""
    return max((w.predicted.ttft_s + max(w.output_tokens - 1.0, 0.0) * w.predicted.tpot_s for w in plan.workloads
                if w.predicted is not None and w.predicted.ttft_s is not None and w.predicted.tpot_s is not None),
               default=0.0)


def settling(plan: PlanDoc, offered: dict[str, float]) -> tuple[float, ReplicaLoad | None]:
    """The warm-up a run of the plan at `offered` req/s per workload needs (module docstring, 2):
    max(RELAXATIONS x the slowest replica's relaxation time, LIFETIMES x lifetime_s); inf: a
    queue never settles. With the slowest-settling replica."""
    slowest = max(replica_loads(plan, offered), key=lambda r: r.relaxation_s, default=None)
    relax = RELAXATIONS * slowest.relaxation_s if slowest is not None else 0.0
    return max(relax, LIFETIMES * lifetime_s(plan)), slowest


@dataclass
class TailAdvice:
    """What a run needs for its p99, and what this run lacked."""

    requests_needed: int
    window_s: float  # measured window that holds requests_needed of every workload
    warmup_s: float  # settling(): relaxation times and request lifetimes (inf: never settles)
    duration_s: float  # the --duration that gives both at the run's warm-up fraction
    warnings: list[str] = field(default_factory=list)

    def statement(self) -> str:
        """One line on how long a run must be to show the tail."""
        pct = f"p{round(TAIL_QUANTILE * 100):d}"
        head = (f"tail: a {pct} needs >= {self.requests_needed} completed requests per workload "
                f"({TAIL_SAMPLES} beyond it) and a warm-up past the queues' settling time")  # fmt: skip
        if math.isinf(self.duration_s):
            return head + "; at this load a queue never settles, so no duration shows a steady " + pct
        return (f"{head}: here >= {_dur(self.window_s)} measured after >= {_dur(self.warmup_s)} warm-up, "
                f"--duration >= {_dur(self.duration_s)}")  # fmt: skip


def _dur(s: float) -> str:
    """A duration as `--duration` reads it, rounded up."""
    if s < 600:
        return f"{math.ceil(s)}s"
    if s < 2 * 3600:
        return f"{math.ceil(s / 60)}min"
    return f"{math.ceil(s / 3600)}h"


def tail_advice(plan: PlanDoc, doc: SimulationDoc) -> TailAdvice:
    """The duration rule above applied to this run, with a warning for each way it falls short."""
    need = requests_for_quantile()
    warm_frac = doc.warmup_s / doc.duration_s if doc.duration_s > 0 else 0.0
    window = 0.0
    warnings = []
    rates = offered_rates(doc)
    for w in doc.workloads:
        rate = rates[w.name]
        if rate > 0:
            window = max(window, need / rate)
        if w.completed < need:
            warnings.append(f"p99 of workload {w.name!r} comes from {w.completed} completed requests, fewer than "
                            f"the {need} it needs: it may be off by far")  # fmt: skip
    warmup, slowest = settling(plan, rates)
    if slowest is not None and math.isinf(warmup):
        warnings.append(f"replica {slowest.id} is offered {slowest.rho:.0%} of its capacity: its queue grows for "
                        "as long as the run lasts, and so does the p99")  # fmt: skip
    elif slowest is not None and doc.warmup_s < warmup:
        life = lifetime_s(plan)
        why = (f"replica {slowest.id} runs at {slowest.rho:.1%} of its capacity: its queue settles"
               if warmup > LIFETIMES * life else f"requests live up to ~{_dur(life)} and the replicas' batches settle")
        warnings.append(f"{why} over ~{_dur(warmup)}, longer than this run's {_dur(doc.warmup_s)} warm-up, "
                        "so the p99 understates the tail")  # fmt: skip
    duration = max(window / (1.0 - warm_frac) if warm_frac < 1 else math.inf,
                   warmup / warm_frac if warm_frac > 0 else (0.0 if warmup == 0 else math.inf))  # fmt: skip
    if warnings and not math.isinf(duration):
        warnings.append(f"run --duration {_dur(duration)} or longer for a p99 to trust")
    return TailAdvice(need, window, warmup, duration, warnings)
