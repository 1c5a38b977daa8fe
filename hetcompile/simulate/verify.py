"""The build's check of a plan by simulation (issue 18, item 2): replay it at its planned load.

A plan with a target to check (an SLO, or `max_ttft_slowdown` set) is replayed with Poisson arrivals
at its own served rates through its replicas and routing weights (simulate/run.py; steady_arrivals:
they go on until the measured requests have finished), seeded and bounded by work, not wall-clock
time. Only the part of the plan the targeted workloads' latencies depend on is replayed
(`part_of`): the replicas they are routed to and whatever else shares them.

    n_w       = max(VERIFY_REQUESTS, 2 x requests_for_quantile(q_w)) measured requests of every
                workload w (simulate/tail.py: a q-quantile needs 10 / (1 - q) requests), in all
                of the R replications (below)
    window    = max_w n_w / (R lambda_w)             seconds of arrivals measured per replication
    warm-up   = simulate/tail.py's settling time at the planned load: RELAXATIONS x the slowest
                replica's relaxation time, and at least LIFETIMES x the longest predicted request
                lifetime, so the queues and batches have settled before the measurement starts
    work      : at most VERIFY_MAX_REQUESTS / R arrivals per replication; a longer run shrinks the
                window first. A plan whose settling warm-up alone takes more than half of that
                (`beyond_budget`: thousands of req/s over a fleet of hundreds of replicas) is not
                replayed: the build says what a replay would need, and its targets stay unchecked

Independent parts (`parts_of`): where the targeted workloads fall into groups that share no replica
(chat on two replicas, rag on two others), each group's latencies depend on its own replicas only, so
each is replayed alone with its own window and warm-up: a group of fast workloads is not simulated
as long as the slowest workload elsewhere needs (llama70b-pp: chat at 1.8 req/s measured 8,000
requests where 2,000 judge it, because long's 0.45 req/s set the window for both). Where the parts'
runs together exceed the work budget, the plan is replayed whole as above (never more work: each
part's run is at most as long as the whole's).

Targets per workload (`Targets`): its SLO (TTFT and TPOT at its percentile q_w) or, without one,
the queueing bound (perf/tail.py's default_ttft_bound): p99 TTFT <= max_ttft_slowdown x TTFT_idle,
where TTFT_idle is the largest idle TTFT of any workload routed to a replica w is routed to. A short
prompt that arrives while a long one fills the chunk budget waits for it (vLLM schedules the
running prefill's chunks first), so on a shared replica the longest prompt's idle TTFT is the
floor of everyone's tail; sizing (profile) used each workload's own idle TTFT, a stricter bound.

Judged with the noise of the run. A workload meets its targets when the share of its requests
outside them is at most 1 - q at the upper one-sided 95% confidence bound of that share, and a
single target misses when the share outside it alone does. The requests are not independent
samples: those in flight together see the same batch (the same TPOT) and the same queue, and a
TPOT tail comes in excursions of the batch size that one 600 s run may or may not contain (chat-rag's
chat at its planned load: 100%, 99.9% and 93.8% within both targets in three seeds of 600 s; 99.0%,
99.1% and 97.6% over an hour). So the run is R = REPLICATIONS independent replications, each with
its own seed, warm-up and n_w / R measured requests (Law & Kelton, Simulation Modeling and Analysis,
§9.4.1): e_r the share outside in replication r, e their mean (pooled), s their standard deviation,

    UCB = max(e + t_{0.95, R-1} s / sqrt(R),  e + Z sqrt(e (1 - e) / n))

(the second term, the independent-samples bound, for runs where no replication sees a miss).
The first SCREEN = 2 replications are judged first: where every workload misses beyond doubt on
them (the share outside above 1 - q at its lower bound, t with one degree of freedom: 6.3) the
round stops there, a verdict more replications would not turn (helix-single24's first plan: 23%
outside its p99 TTFT bound in each). A rare excursion is not such a miss: helix-cluster10's first
plan had 0 and 4 of 500 requests outside in its first two replications, and its p99 of 43 s comes
from the other two.

A workload too small for its own percentile (fewer than requests_for_quantile(q) measured requests:
a spec of thousands of workloads at a few requests per hour each) cannot be judged alone: with a
dozen requests, even none outside leaves an upper bound far above 1 - q, and no replan gives it more
requests. Such workloads are judged pooled with every other such workload of the same targets (kind,
q, TTFT and TPOT bounds): one share outside over all their requests, and a miss is a miss of each.

Where a target misses, `tighten` says how much less load that workload's replicas may take (the
ratio target / simulated, at least TIGHTEN_MIN and at most TIGHTEN_MAX of the load per round); the
driver re-solves with that factor and replays again, for at most MAX_ROUNDS plans. An SLO still
missed is an error at the SLO's line; a queueing bound still missed leaves the plan standing, with
`Verification.unmet` (and plan.md) saying so.
"""

from __future__ import annotations

import dataclasses
import functools

import hashlib
import math
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from hetcompile.perf.tail import PERCENTILES, idle_ttft
from hetcompile.plan.doc import PlanDoc, Verification, VerifiedPart, VerifiedWorkload
from hetcompile.simulate.doc import SimulationDoc
from hetcompile.simulate.engine import Request
from hetcompile.simulate.run import by_workload, measured, replay, steady_arrivals, summarize, tpot_of, ttft_of, within
from hetcompile.simulate.tail import LIFETIMES, lifetime_s, requests_for_quantile, settling

REPLICATIONS = 4
T_95 = {1: 6.314, 2: 2.920, 3: 2.353}  # one-sided 95% Student t quantiles by degrees of freedom (replications - 1)
SCREEN = 2  # replications judged first: a round that misses beyond doubt on them stops there (module docstring)
VERIFY_SEED = 0  # replication r runs with seed VERIFY_SEED + r
VERIFY_REQUESTS = 2000
VERIFY_MAX_REQUESTS = 40_000
MAX_ROUNDS = 5
TIGHTEN_MIN, TIGHTEN_MAX = 0.5, 0.9
Z = 1.645  # one-sided 95% normal quantile


@dataclass(frozen=True)
class Targets:
    """What one workload is checked against: its SLO, or the queueing bound."""

    workload: str
    kind: str  # "slo" | "queueing"
    percentile: str
    q: float
    ttft_s: float | None
    tpot_s: float | None


@dataclass(frozen=True)
class Miss:
    """One target the simulation did not meet (too many requests outside it at the confidence bound):
    the simulated percentile, point estimate, against the target."""

    workload: str
    what: str  # "TTFT" | "TPOT"
    percentile: str
    simulated_s: float
    target_s: float
    kind: str = "slo"  # "slo" | "queueing"


def targets(plan: PlanDoc) -> list[Targets]:
    """Every routed workload's targets (module docstring), in name order."""
    reps = {r.id: r for r in plan.replicas}
    out = []
    idle_of = functools.cache(idle_ttft)  # workloads of one kind share their idle TTFTs

    @functools.cache
    def slowest_idle(r: str) -> float | None:
        """The largest TTFT_idle among the workloads routed to replica r (None: none is)."""
        vals = [idle_of(reps[r].replica_model(), o.input_tokens, o.output_tokens) for o in plan.workloads
                if plan.routing.get(o.name, {}).get(r, 0.0) > 0]
        return max(vals) if vals else None

    for w in sorted(plan.workloads, key=lambda w: w.name):
        if w.served_requests_per_s <= 0:
            continue
        s = w.slo
        if s is not None and (s.ttft_s is not None or s.tpot_s is not None):
            out.append(Targets(w.name, "slo", s.percentile, PERCENTILES[s.percentile], s.ttft_s, s.tpot_s))
            continue
        if plan.max_ttft_slowdown is None:
            continue
        mine = [r for r, x in plan.routing.get(w.name, {}).items() if x > 0 and r in reps and reps[r].step_model is not None]
        idle = [x for x in (slowest_idle(r) for r in mine) if x is not None]
        if idle:
            out.append(Targets(w.name, "queueing", "p99", PERCENTILES["p99"], plan.max_ttft_slowdown * max(idle), None))
    return out


def parts_of(plan: PlanDoc, ts: list[Targets], budget: float = math.inf) -> list[tuple[PlanDoc, list[Targets]]]:
    """The plan's independent parts with their targets: part_of each targeted workload, merged where
    they share a replica (part_of closes over shared replicas, so each is a connected component of
    the routing), in the order of their first targeted workload's name. One part, the plan whole,
    where two parts would share a replica all the same (a prefill replica of two P/D groups: part_of
    adds those after its fixed point) or where the parts' natural_requests exceed `budget` (found
    part by part: a part needs at least VERIFY_REQUESTS, so a spec of thousands of workloads on
    their own replicas stops after a few dozen part_of calls, not thousands)."""
    out: list[tuple[PlanDoc, list[Targets]]] = []
    seen: set[str] = set()
    used: set[str] = set()
    need = 0.0
    for t in ts:
        if t.workload in seen:
            continue
        part = part_of(plan, {t.workload})
        names = {w.name for w in part.workloads}
        reps = {r.id for r in part.replicas}
        mine = [x for x in ts if x.workload in names]
        need += natural_requests(part, mine)
        if reps & used or need > budget:
            return [(plan, ts)]
        seen |= names
        used |= reps
        out.append((part, mine))
    return out


def natural_requests(plan: PlanDoc, ts: list[Targets]) -> float:
    """Requests the replications of a part simulate at the length its own rates ask for (settling
    warm-up and measured window, uncapped; inf where it never settles)."""
    warmup = planned_warmup(plan)
    return REPLICATIONS * sum(w.served_requests_per_s for w in plan.workloads) * (warmup + _window(plan, ts))


def part_of(plan: PlanDoc, workloads: set[str]) -> PlanDoc:
    """The part of the plan the given workloads' latencies depend on: the replicas they are routed
    to, and every workload routed to those (and their replicas, to a fixed point); a replica outside
    it shares no queue with them, so leaving it out changes none of their numbers and saves its steps."""
    reps: set[str] = set()
    ws = set(workloads)
    while True:
        more = {r for w in ws for r, x in plan.routing.get(w, {}).items() if x > 0}
        wider = ws | {w for w, weights in plan.routing.items() if any(weights.get(r, 0) > 0 for r in more)}
        if more <= reps and wider <= ws:
            break
        reps |= more
        ws = wider
    groups = tuple(g for g in plan.groups or () if set(g.decode) & reps)
    reps |= {p for g in groups for p in g.prefill}  # a group's prefill replicas are reached through its decode ones
    return plan.model_copy(update={
        "replicas": tuple(r for r in plan.replicas if r.id in reps),
        "workloads": tuple(w for w in plan.workloads if w.name in ws),
        "routing": {w: x for w, x in plan.routing.items() if w in ws},
        "groups": groups or None,
    })


def planned_warmup(plan: PlanDoc) -> float:
    """simulate/tail.py's settling time of the plan at its own served rates: RELAXATIONS x the
    slowest replica's relaxation time, and at least LIFETIMES x the longest predicted request lifetime."""
    return settling(plan, {w.name: w.served_requests_per_s for w in plan.workloads})[0]


def _window(plan: PlanDoc, ts: list[Targets]) -> float:
    """Seconds of arrivals measured per replication (module docstring)."""
    served = {w.name: w.served_requests_per_s for w in plan.workloads}
    return max(max(VERIFY_REQUESTS, 2 * requests_for_quantile(t.q)) / (REPLICATIONS * served[t.workload]) for t in ts)


def _work_cap(plan: PlanDoc) -> float:
    """Seconds of arrivals the work budget allows per replication at the plan's served rates."""
    return VERIFY_MAX_REQUESTS / (REPLICATIONS * sum(w.served_requests_per_s for w in plan.workloads))


def run_length(plan: PlanDoc, ts: list[Targets]) -> tuple[float, float]:
    """(duration, warm-up) of the verification run (module docstring); (0, 0): nothing to verify."""
    if not ts:
        return 0.0, 0.0
    window, warmup, cap = _window(plan, ts), planned_warmup(plan), _work_cap(plan)
    if math.isinf(warmup) or warmup > cap / 2:
        warmup = cap / 2  # a queue that never settles shows up as a miss anyway
    return min(warmup + window, cap), warmup


def beyond_budget(plan: PlanDoc) -> tuple[int, float] | None:
    """(requests a replay that settles needs, the settling time in s) when the plan's targeted part
    cannot be verified within the work budget: half of the VERIFY_MAX_REQUESTS the replications may
    simulate does not last LIFETIMES request lifetimes at the planned rate, so the window would
    measure a fleet still filling up and its requests would miss for that alone
    (bench/data/scale1072.yaml: 4,925 req/s, settling in 511 s, 2.5M requests per replication; the
    budget left 1 s of warm-up, and every workload missed in each of 5 rounds). A part near
    saturation, whose relaxation time alone exceeds the budget (cost-efficiency-appc), is still
    replayed on the warm-up the budget allows, as an overloaded one is: a miss there is real.
    None when it can be verified."""
    ts = targets(plan)
    if not ts:
        return None
    part = part_of(plan, {t.workload for t in ts})
    if _work_cap(part) / 2 >= LIFETIMES * lifetime_s(part):
        return None
    warmup = planned_warmup(part)
    total = sum(w.served_requests_per_s for w in part.workloads)
    return int(math.ceil(REPLICATIONS * total * (warmup + _window(part, ts)))), warmup


def share_outside_ucb(outside: list[list[bool]]) -> float:
    """The upper 95% confidence bound of the share of requests outside a target, from each
    replication's requests (module docstring: replication means, floored by the independent-samples
    bound)."""
    return _ucb([sum(o) for o in outside], [len(o) for o in outside])


def _ucb(outside: list[int], sizes: list[int]) -> float:
    """share_outside_ucb from each replication's count outside and count of requests."""
    n = sum(sizes)
    return sum(outside) / n + _half_width(outside, sizes) if n else 1.0


def _lcb(outside: list[int], sizes: list[int]) -> float:
    """The lower one-sided 95% confidence bound of the same share (0: no requests)."""
    n = sum(sizes)
    return sum(outside) / n - _half_width(outside, sizes) if n else 0.0


def _half_width(outside: list[int], sizes: list[int]) -> float:
    """The one-sided 95% half-width of the share outside: the replication means' (t, R - 1 degrees
    of freedom), at least the independent samples' (normal)."""
    n = sum(sizes)
    e = sum(outside) / n
    width = Z * math.sqrt(e * (1.0 - e) / n)
    shares = [k / m for k, m in zip(outside, sizes) if m]
    if len(shares) >= 2:
        width = max(width, T_95[len(shares) - 1] * float(np.std(shares, ddof=1)) / math.sqrt(len(shares)))
    return width


def judged_bound(values: list[np.ndarray], q: float) -> float:
    """The smallest bound x a metric meets as judge() judges a target: the share of requests above x
    (per replication, `values`) is at most 1 - q at its upper confidence bound (inf: no finite x
    does). By binary search over the values, the share outside falling as x grows. A target x
    misses alone exactly when x < judged_bound, so judged_bound / target says how far a round is
    from holding it: the verify pass steers its next load share by that."""
    xs = np.unique(np.concatenate(values)) if values else np.empty(0)
    xs = xs[np.isfinite(xs)]
    sizes = [len(v) for v in values]

    def meets(x: float) -> bool:
        return _ucb([int(np.count_nonzero(v > x)) for v in values], sizes) <= 1.0 - q

    if not len(xs) or not meets(float(xs[-1])):
        return math.inf
    lo, hi = 0, len(xs) - 1  # meets(xs[hi]) holds throughout
    while lo < hi:
        mid = (lo + hi) // 2
        if meets(float(xs[mid])):
            hi = mid
        else:
            lo = mid + 1
    return float(xs[hi])


def bound_ratios(t: Targets, runs: list[list[Request]]) -> tuple[float | None, float | None]:
    """judged_bound / target of t's TTFT and of its TPOT target (None: that target is not set). An
    unfinished request is outside both; one of a single output token is within any TPOT."""
    def ttft(r: Request) -> float:
        return ttft_of(r) if r.finish is not None else math.inf

    def tpot(r: Request) -> float:
        x = tpot_of(r) if r.finish is not None else math.inf
        return 0.0 if x is None else x

    def ratio(of, target: float | None) -> float | None:
        if target is None or target <= 0:
            return None
        return judged_bound([np.array([of(r) for r in run], dtype=float) for run in runs], t.q) / target

    return ratio(ttft, t.ttft_s), ratio(tpot, t.tpot_s)


def _point(values: list[float], q: float) -> float | None:
    finite = [v for v in values if math.isfinite(v)]
    return float(np.percentile(np.asarray(finite), 100 * q)) if finite else None


def judge(t: Targets, runs: list[list[Request]]) -> tuple[VerifiedWorkload, list[Miss]]:
    """One workload's measured requests, per replication, against its targets (module docstring)."""
    reqs = [r for run in runs for r in run]
    ttft = [ttft_of(r) for r in reqs]
    tpot = [x for r in reqs if (x := tpot_of(r)) is not None]
    over: list[tuple[float, Miss]] = []  # (UCB of the share outside this target alone, miss)
    for what, target, values in (("TTFT", t.ttft_s, ttft), ("TPOT", t.tpot_s, tpot)):
        if target is None:
            continue
        ucb = share_outside_ucb([[not within(r, target if what == "TTFT" else None, target if what == "TPOT" else None)
                                  for r in run] for run in runs])
        point = _point(values, t.q)
        over.append((ucb, Miss(t.workload, what, t.percentile, math.inf if point is None else point, target, t.kind)))
    misses = [m for ucb, m in over if ucb > 1.0 - t.q]
    outside = [[not within(r, t.ttft_s, t.tpot_s) for r in run] for run in runs]
    if not misses and over and share_outside_ucb(outside) > 1.0 - t.q:
        misses = [max(over, key=lambda x: x[0])[1]]  # each within, both together not: tighten the nearer
    out = sum(sum(o) for o in outside)
    ttft_ratio, tpot_ratio = bound_ratios(t, runs)
    vw = VerifiedWorkload(
        name=t.workload, target=t.kind, percentile=t.percentile, ttft_target_s=t.ttft_s, tpot_target_s=t.tpot_s,
        ttft_s=_point(ttft, t.q), tpot_s=_point(tpot, t.q), p99_ttft_s=_point(ttft, 0.99), p99_tpot_s=_point(tpot, 0.99),
        attainment=1.0 - out / len(reqs) if reqs else None, met=not misses, factor=1.0,
        ttft_ratio=ttft_ratio, tpot_ratio=tpot_ratio)
    return vw, misses


# verify() is a pure function of the plan part it replays, its targets, the seed and the run's
# sizes (seeded, work-bounded): the last few results, by those, are returned again, so a process
# that builds the same spec again (the test suite, a replan to the same plan) does not replay it
# again. Exact, not a shortcut: a changed plan, or any changed number in it, is a different key.
_RECENT: OrderedDict = OrderedDict()
_RECENT_SIZE = 32


def verify(plan: PlanDoc, seed: int = VERIFY_SEED,
           workers: int = 1) -> tuple[list[SimulationDoc] | None, list[VerifiedWorkload], list[Miss]]:
    """Replay the plan's targeted part at its planned load, REPLICATIONS times with seeds seed,
    seed + 1, ... (module docstring); (None, [], []) when nothing is to be checked. `workers` > 1
    runs the replications in that many processes (independent seeds: the same results, in order)."""
    ts = targets(plan)
    if not ts:
        return None, [], []
    plan = part_of(plan, {t.workload for t in ts})
    key = (hashlib.sha256(plan.model_dump_json().encode()).hexdigest(), seed, tuple(ts), REPLICATIONS, VERIFY_REQUESTS,
           VERIFY_MAX_REQUESTS)
    if key not in _RECENT:
        docs, ws, misses = _by_parts(plan, ts, seed, workers)
        _RECENT[key] = (None if docs is None else tuple(docs), tuple(ws), tuple(misses))
        if len(_RECENT) > _RECENT_SIZE:
            _RECENT.popitem(last=False)
    _RECENT.move_to_end(key)
    docs, ws, misses = _RECENT[key]  # immutable records; fresh lists for the caller
    return None if docs is None else list(docs), list(ws), list(misses)


def _by_parts(plan: PlanDoc, ts: list[Targets], seed: int,
              workers: int) -> tuple[list[SimulationDoc] | None, list[VerifiedWorkload], list[Miss]]:
    """_replicate on each independent part (parts_of), each as long as its own rates need, where
    they fit the work budget together; else the plan replayed whole, as long as its slowest
    workload needs (each part's run is at most as long as the whole's, so never more work). The
    records in the targets' order; the docs part by part."""
    parts = parts_of(plan, ts, budget=VERIFY_MAX_REQUESTS)
    if len(parts) < 2:
        return _replicate(plan, ts, seed, workers)
    docs: list[SimulationDoc] = []
    ws: dict[str, VerifiedWorkload] = {}
    misses: dict[str, list[Miss]] = {}
    for part, pts in parts:
        d, w, m = _replicate(part, pts, seed, workers)
        assert d is not None  # a part has a target and a positive rate
        docs += d
        ws.update((x.name, x) for x in w)
        for x in m:
            misses.setdefault(x.workload, []).append(x)
    return docs, [ws[t.workload] for t in ts], [x for t in ts for x in misses.get(t.workload, [])]


def _one(plan: PlanDoc, ts: list[Targets], duration: float, warmup: float, seed: int) -> tuple[SimulationDoc, dict]:
    """One replication: its summary and, per targeted workload, the requests it measured."""
    requests, sims = replay(plan, steady_arrivals(plan, duration, seed), duration)
    mine = by_workload(requests)
    return (summarize(plan, requests, sims, duration, warmup, seed=seed),
            {t.workload: measured(mine.get(t.workload, []), t.workload, warmup, duration) for t in ts})


def _replicate(plan: PlanDoc, ts: list[Targets], seed: int,
               workers: int = 1) -> tuple[list[SimulationDoc] | None, list[VerifiedWorkload], list[Miss]]:
    duration, warmup = run_length(plan, ts)
    if duration <= 0:
        return None, [], []
    seeds = [seed + k for k in range(REPLICATIONS)]
    # the first SCREEN replications are judged alone; where workers can run every replication at
    # once they all run, and the rest are dropped on the same verdict: the result never depends on
    # the workers
    first = seeds if workers >= REPLICATIONS else seeds[:SCREEN]
    results = _runs(plan, ts, duration, warmup, first, workers)
    if missed_beyond_doubt(ts, {t.workload: [m[t.workload] for _, m in results[:SCREEN]] for t in ts}):
        results = results[:SCREEN]
    else:
        results += _runs(plan, ts, duration, warmup, seeds[len(first):], workers)
    docs, runs = [d for d, _ in results], {t.workload: [m[t.workload] for _, m in results] for t in ts}
    pooled = _pooled(ts, runs)
    ws, misses = [], []
    for t in ts:
        vw, mine = judge(t, runs[t.workload])
        if t.workload in pooled:
            mine, pooled_vw = pooled[t.workload]
            vw = vw.model_copy(update={"met": not mine, "ttft_ratio": pooled_vw.ttft_ratio, "tpot_ratio": pooled_vw.tpot_ratio})
        ws.append(vw)
        misses += mine
    return docs, ws, misses


def _runs(plan: PlanDoc, ts: list[Targets], duration: float, warmup: float, seeds: list[int],
          workers: int) -> list[tuple[SimulationDoc, dict]]:
    """The replications of the given seeds, in `workers` forked processes where more than one (each
    replication is a pure function of its seed: the same results, in order)."""
    if workers > 1 and len(seeds) > 1:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(min(workers, len(seeds)), mp_context=multiprocessing.get_context("fork")) as pool:
            return list(pool.map(_one, *zip(*[(plan, ts, duration, warmup, k) for k in seeds])))
    return [_one(plan, ts, duration, warmup, k) for k in seeds]


def missed_beyond_doubt(ts: list[Targets], runs: dict[str, list[list[Request]]]) -> bool:
    """Every workload's targets missed beyond doubt in these replications: the share of its requests
    outside them is above 1 - q at its lower 95% confidence bound (t with R - 1 degrees of freedom,
    6.3 for two replications). Then more replications would not turn the round's verdict, and the
    pass's next step (a tighten step, or the lines through the misses) needs no more precision than
    these give. False where a workload is too small to be judged alone (pooled)."""
    for t in ts:
        mine = runs[t.workload]
        if sum(len(run) for run in mine) < requests_for_quantile(t.q):
            return False
        outside = [sum(not within(r, t.ttft_s, t.tpot_s) for r in run) for run in mine]
        if _lcb(outside, [len(run) for run in mine]) <= 1.0 - t.q:
            return False
    return bool(ts)


def pooled_misses(ts: list[Targets], runs: dict[str, list[list[Request]]]) -> dict[str, list[Miss]]:
    """The misses of each workload too small to be judged alone, judged pooled with the others of its
    targets (module docstring); {} when there are none. A group of one is judged alone."""
    return {w: misses for w, (misses, _) in _pooled(ts, runs).items()}


def _pooled(ts: list[Targets], runs: dict[str, list[list[Request]]]) -> dict[str, tuple[list[Miss], VerifiedWorkload]]:
    """pooled_misses, with each group's pooled record (its bound ratios)."""
    groups: dict[tuple, list[Targets]] = {}
    for t in ts:
        if sum(len(run) for run in runs[t.workload]) < requests_for_quantile(t.q):
            groups.setdefault((t.kind, t.q, t.ttft_s, t.tpot_s), []).append(t)
    out: dict[str, tuple[list[Miss], VerifiedWorkload]] = {}
    for group in (g for g in groups.values() if len(g) > 1):
        together = [[r for t in group for r in runs[t.workload][k]] for k in range(len(runs[group[0].workload]))]
        vw, misses = judge(group[0], together)
        for t in group:
            out[t.workload] = ([dataclasses.replace(m, workload=t.workload) for m in misses], vw)
    return out


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


def summary(docs: list[SimulationDoc], ws: list[VerifiedWorkload], rounds: int, factors: dict[str, float],
            unmet: tuple[str, ...] = ()) -> Verification:
    """The round's record: its parts (the docs of one part are consecutive and name the same
    workloads) and its workloads with their load shares."""
    groups: list[list[SimulationDoc]] = []
    for d in docs:
        if groups and [w.name for w in groups[-1][0].workloads] == [w.name for w in d.workloads]:
            groups[-1].append(d)
        else:
            groups.append([d])
    parts = tuple(VerifiedPart(
        workloads=tuple(w.name for w in g[0].workloads), replicas=tuple(r.id for r in g[0].replicas),
        replications=len(g), requests=sum(w.arrived for d in g for w in d.workloads),
        duration_s=g[0].duration_s, warmup_s=g[0].warmup_s) for g in groups)
    longest = max(parts, key=lambda p: p.duration_s)
    return Verification(
        seed=docs[0].seed, replications=max(p.replications for p in parts), requests=sum(p.requests for p in parts),
        duration_s=longest.duration_s, warmup_s=longest.warmup_s, parts=parts,
        rounds=rounds, workloads=tuple(w.model_copy(update={"factor": factors.get(w.name, 1.0)}) for w in ws),
        unmet=unmet,
    )
