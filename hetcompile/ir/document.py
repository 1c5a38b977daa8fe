"""The plan document of an IR: the finished Problem as a `PlanDoc` (hetcompile/plan/doc.py).

What plan.json holds (backends/plan_json.py writes it) and what the build's verification simulates
(passes/verify.py), built in one place. Wall-clock times are left out on purpose (they differ run
to run); they go to timings.json.
`totals` are computed from the emitted replicas and nodes; the bound comes from the solve whose
search space contains the plan (compose, when its replicas are deployed as they are).
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

import numpy as np

from hetcompile import __version__
from hetcompile.plan.doc import (
    Compiler, EngineSettings, PassSummary, PlanDoc, PlanGroup, PlanModel, PlanNode, PlanPrice, PlanReplica, PlanStage, PlanWorkload,
    ReplicaWorkload, Slo, TailLatency, Totals,
)
from hetcompile.ir.disagg import transfer_seconds
from hetcompile.ir.engine import engine_args
from hetcompile.plan.step_record import record_of
from hetcompile.ir.problem import Problem, Replica
from hetcompile.opt.solve import relative_gap
from hetcompile.perf.tail import P_GRID, PERCENTILES, TailModel, mixture_quantile, percentile_name

def capacity_bound(term: str) -> dict:
    """The IR's binding term ('slo-unmeetable: <reason>' carries its reason) as the plan's typed fields."""
    kind, _, reason = term.partition(": ")
    return {"binding": kind, "binding_reason": reason or None}


OBJECTIVE_UNIT = {
    "max-throughput": "x demand",
    "min-makespan": "x demand",
    "min-cost": "$/h",
    "max-throughput-per-dollar": "x demand per $/h",
}


def solver_version() -> str:
    try:
        return f"highspy {version('highspy')}"
    except PackageNotFoundError:  # pragma: no cover
        return "highspy unknown"


def replica_price_per_s(ir: Problem, r: Replica) -> float:
    assert ir.nodes is not None  # a built plan has them
    nodes = {n.id: n for n in ir.nodes}
    return sum(nodes[s.node].price_per_s for s in r.stages)


def workload_rates(ir: Problem) -> dict[str, float]:
    """Requests/s the plan serves per workload: theta * lambda_w."""
    assert ir.composition is not None  # a built plan has them
    scale = ir.composition.scale
    return {w.name: scale * w.demand for w in ir.workloads}


def achieved(ir: Problem, price_per_hour: float) -> float | None:
    """The emitted plan's objective value, in the unit of OBJECTIVE_UNIT."""
    assert ir.composition is not None  # a built plan has them
    theta = ir.composition.scale
    if ir.objective == "min-cost":
        return price_per_hour
    if ir.objective == "max-throughput-per-dollar":
        return theta / price_per_hour if price_per_hour > 0 else None  # owned-only plan: unbounded
    return theta


def proven_bound(ir: Problem) -> tuple[float | None, str]:
    """(bound, its source). compose's bound holds for the emitted plan only when its replicas are
    deployed as they are (placement kept none of its own) and no churn term is in its objective."""
    compose = next((r for r in ir.reports if r.name == "compose"), None)
    if compose is None or compose.bound is None:
        return None, "none: no solve proved a bound"
    if any(p.kept == "placement" for p in ir.placements):
        return None, "none: compose's bound covers single-type replicas; the placed chains are outside its search space"
    if ir.previous is not None:
        return None, "none: compose's bound includes the churn penalty of --previous"
    return compose.bound, "compose"


def totals(ir: Problem) -> Totals:
    assert ir.composition is not None and ir.nodes is not None  # a built plan has them
    rates = workload_rates(ir)
    ws = {w.name: w for w in ir.workloads}
    prompt = sum(v * ws[w].input_tokens for w, v in rates.items())
    output = sum(v * ws[w].output_tokens for w, v in rates.items())
    cost = sum(n.price_per_s for n in ir.nodes)
    value = achieved(ir, cost * 3600)
    bound, source = proven_bound(ir)
    return Totals(
        requests_per_s=sum(rates.values()), tokens_per_s=prompt + output, output_tokens_per_s=output,
        price_per_hour=cost * 3600, budget_per_hour=ir.budget_per_s * 3600 if ir.budget_per_s is not None else None,
        scale=ir.composition.scale, gpus=sum(n.gpus for n in ir.nodes), objective=ir.objective,
        objective_value=value, objective_unit=OBJECTIVE_UNIT[ir.objective], bound=bound,
        gap=relative_gap(value, bound), bound_source=source,
        makespan_s=1.0 / ir.composition.scale if any(w.demand_kind == "requests" for w in ir.workloads) and ir.composition.scale > 0 else None,
        tokens_per_dollar=(prompt + output) / cost if cost > 0 else None,
        binding=ir.composition.binding,
    )


def replica_doc(ir: Problem, r: Replica) -> PlanReplica:
    est = r.estimate
    conc, bind, ttft, tpot = dict(est.concurrency), dict(est.binding), dict(est.ttft_s), dict(est.tpot_s)
    full = dict(est.full_rps) or dict(est.throughput_rps)
    return PlanReplica(
        id=r.id, model=r.model, served_name=ir.model(r.model).served_name, shape=r.shape, dtype=r.dtype, mixed=r.mixed,
        tp=r.stages[0].tp, pp=len(r.stages), partition=tuple(s.layers for s in r.stages),
        stages=tuple(PlanStage(node=s.node, gpu=s.gpu, region=s.region, tp=s.tp, layers=(s.layer_start, s.layer_end))
                     for s in r.stages),
        kv_capacity_tokens=est.kv_capacity_tokens, prefill_tokens_per_s=est.prefill_tokens_per_s,
        decode_tokens_per_s=est.decode_tokens_per_s, estimate_source=est.source,
        workloads={w: ReplicaWorkload(capacity_requests_per_s=full.get(w, rps), planned_max_requests_per_s=rps,
                                      concurrency=conc[w], ttft_s=ttft.get(w), tpot_s=tpot.get(w), **capacity_bound(bind[w]))
                   for w, rps in est.throughput_rps},
        price_per_hour=replica_price_per_s(ir, r) * 3600,
        step_model=record_of(est.step_model) if est.step_model is not None else None,
        step_source=est.step_model.step_source if est.step_model is not None else None,
        engine_args=tuple(f"{k} {v}" for k, v in engine_args(ir, r)),
        role=r.role, group=r.group,
    )


SATURATED = 1.0 - 1e-4  # a replica planned this close to its full load has no steady tail


class PlannedTails:
    """Latency percentiles per workload at the plan's own load (perf/tail.py), over the replicas it
    is routed to (`at`).

    Replica r gets lambda_{r,w} = served_w x weight_{r,w} / sum_r weight_{r,w} (the router's
    weighted policy); its utilization rho_r = sum_w lambda_{r,w} / h_{r,w} (compose's linear mix),
    and a workload on it is judged at rho_r x h_{r,w}, the same utilization of that workload alone."""

    def __init__(self, ir: Problem, routing: dict[str, dict[str, float]], served: dict[str, float]) -> None:
        assert ir.replicas is not None  # a built plan has them
        self.ir, self.routing = ir, routing
        self.ws = {w.name: w for w in ir.workloads}
        self.rho: dict[str, float] = {}
        self.prompts: dict[str, list[tuple[float, float]]] = {}  # (req/s, prompt tokens) routed to each replica
        self.rates: dict[tuple[str, str], float] = {}  # lambda_{r,w}
        for r in ir.replicas:
            full = dict(r.estimate.full_rps) or dict(r.estimate.throughput_rps)
            rho, flows = 0.0, []
            for w, weights in sorted(routing.items()):
                total = sum(weights.values())
                lam = served.get(w, 0.0) * weights.get(r.id, 0.0) / total if total > 0 else 0.0
                if lam > 0:
                    rho += lam / full[w] if full.get(w, 0.0) > 0 else float("inf")
                    flows.append((lam, self.ws[w].input_tokens))
                    self.rates[(r.id, w)] = lam
            self.rho[r.id], self.prompts[r.id] = rho, flows
        self._models: dict[tuple[str, float, float], list] = {}
        self._tpots: dict[str, np.ndarray] = {}
        # replicas of one kind (the same step model) share their tail model, and their points when
        # they also share the load and the prompts around them: bench/data/scale1072.yaml's 810
        # replicas have 21 step models
        self._tails: dict[tuple, TailModel] = {}
        self._points: dict[tuple, list] = {}

    def _curve(self, r, w: str) -> list:
        """The tail model's points of workload w on replica r at every quantile of P_GRID (the
        same for every workload of w's lengths on r: computed once per kind, not per workload)."""
        wl = self.ws[w]
        key = (r.id, wl.input_tokens, wl.output_tokens)
        if key not in self._models:
            kind = (r.estimate.step_model, wl.input_tokens, wl.output_tokens)
            tm = self._tails.get(kind)
            if tm is None:
                tm = self._tails[kind] = TailModel(r.estimate.step_model, wl.input_tokens, wl.output_tokens)
            # at full load (max_utilization 100%) no queue settles: no percentile to state (null)
            rho = self.rho[r.id] if self.rho[r.id] < SATURATED else 1.0
            at = (*kind, rho, tuple(self.prompts[r.id]))
            if at not in self._points:
                self._points[at] = tm.points(rho * tm.h_full, [float(p) for p in P_GRID], self.prompts[r.id])
            self._models[key] = self._points[at]
        return self._models[key]

    def _tpot(self, r) -> np.ndarray:
        """TPOT quantiles on a replica over P_GRID: every sequence in it waits for the same steps, so
        the workloads it serves share one TPOT, their tail models' mixed by the sequences each keeps
        in flight (lambda_{r,w} x O_w). Once per replica."""
        if r.id not in self._tpots:
            self._tpots[r.id] = self._mixed_tpot(r)
        return self._tpots[r.id]

    def _mixed_tpot(self, r) -> np.ndarray:
        num, den = np.zeros(len(P_GRID)), 0.0
        for w in sorted(self.routing):
            if self.routing[w].get(r.id, 0.0) <= 0:
                continue
            weight = max(self.rates.get((r.id, w), 0.0), 1e-12) * self.ws[w].output_tokens
            num += weight * np.array([p.tpot_s for p in self._curve(r, w)])
            den += weight
        return num / den if den > 0 else np.full(len(P_GRID), np.inf)

    def at(self, w: str, q: float) -> TailLatency | None:
        """The workload's q-quantiles over all its requests: the router sends share s_r of them to
        replica r, so P(T > t) = sum_r s_r P_r(T > t), with P_r from each replica's quantiles (the
        tail model at its planned load on P_GRID); solved for P(T > t) = 1 - q (mixture_quantile)."""
        assert self.ir.replicas is not None  # a built plan has them
        weights = self.routing.get(w, {})
        phase = [r for r in self.ir.replicas if r.role == "decode" and weights.get(r.id, 0.0) > 0]
        phase_ids = {r.id for r in phase}
        total = sum(x for r, x in weights.items() if r not in phase_ids)
        routed = [(weights[r.id] / total, r) for r in self.ir.replicas
                  if total > 0 and weights.get(r.id, 0.0) > 0 and r.role is None and r.estimate.step_model is not None]
        if not routed and not phase:
            return None
        finite = lambda x: x if x is not None and x < float("inf") else None  # noqa: E731
        ttft = tpot = None
        if routed:
            ttft = mixture_quantile([(sr, np.array([p.ttft_s for p in self._curve(r, w)])) for sr, r in routed], q)
            tpot = mixture_quantile([(sr, self._tpot(r)) for sr, r in routed], q)
        if phase:  # a disaggregated group: its sizing's own TTFT and TPOT at the SLO's quantile (perf/disagg.size)
            groups = {r.group for r in phase}
            pre = [dict(r.estimate.ttft_s).get(w) for r in self.ir.replicas if r.role == "prefill" and r.group in groups]
            dec = [dict(r.estimate.tpot_s).get(w) for r in phase]
            ttft = max([x for x in [ttft, *pre] if x is not None], default=None)
            tpot = max([x for x in [tpot, *dec] if x is not None], default=None)
        return TailLatency(percentile=percentile_name(q), ttft_s=finite(ttft), tpot_s=finite(tpot),
                           utilization=max(self.rho[r.id] for r in [*(r for _, r in routed), *phase]))


def slo_doc(ir: Problem, w, tails: PlannedTails) -> Slo:
    """Target, prediction (tail model at the planned load) and, when the build verified the plan,
    the simulated percentile of one workload's SLO."""
    pred = tails.at(w.name, w.slo_quantile)
    pt, pp = (pred.ttft_s, pred.tpot_s) if pred is not None else (None, None)
    ver = next((v for v in ir.verification.workloads if v.name == w.name), None) if ir.verification else None
    met = None
    if ver is not None:
        met = ver.met
    elif pred is not None:
        eps = 1e-9
        met = ((w.ttft_slo is None or (pt is not None and pt <= w.ttft_slo * (1 + eps)))
               and (w.tpot_slo is None or (pp is not None and pp <= w.tpot_slo * (1 + eps))))
    return Slo(ttft_s=w.ttft_slo, tpot_s=w.tpot_slo, percentile=percentile_name(w.slo_quantile), predicted_ttft_s=pt,
               predicted_tpot_s=pp, simulated_ttft_s=ver.ttft_s if ver else None, simulated_tpot_s=ver.tpot_s if ver else None,
               simulated_attainment=ver.attainment if ver else None, met=met)


def simulated_tail(ir: Problem, w: str, predicted: TailLatency | None) -> TailLatency | None:
    """The workload's p99 TTFT and TPOT in the build's simulation of the plan (null: not simulated)."""
    ver = next((v for v in ir.verification.workloads if v.name == w), None) if ir.verification else None
    if ver is None:
        return None
    return TailLatency(percentile="p99", ttft_s=ver.p99_ttft_s, tpot_s=ver.p99_tpot_s,
                       utilization=predicted.utilization if predicted else None)


def next_replica(ir: Problem) -> int:
    """One past the highest replica number this plan or its predecessors used (ids are never reused)."""
    assert ir.replicas is not None  # a built plan has them
    used = [int(r.id[1:]) for r in ir.replicas if r.id[:1] == "r" and r.id[1:].isdigit()]
    prev = ir.previous.next_replica if ir.previous is not None else 0
    return max([prev, *(u + 1 for u in used)])


def plan_doc(ir: Problem) -> PlanDoc:
    assert ir.composition is not None and ir.nodes is not None and ir.replicas is not None and ir.routing is not None  # a built plan has them
    served = workload_rates(ir)
    groups = {g.id: g for g in ir.routing.groups}
    routing: dict[str, dict[str, float]] = {}
    for m in ir.routing.models:
        for c in m.classes:
            routing[c.name] = {}
            for w in c.weights:  # a group's share goes to its decode replicas (PlanGroup's docstring)
                for rid, x in ((d.replica, w.weight * d.weight) for d in groups[w.replica].decode) if w.replica in groups \
                        else ((w.replica, w.weight),):
                    routing[c.name][rid] = round(routing[c.name].get(rid, 0.0) + x, 6)
    tails = PlannedTails(ir, routing, served)
    return PlanDoc(
        compiler=Compiler(version=__version__, solver=solver_version()),
        plan=ir.name, spec_hash=ir.spec_hash,
        models=tuple(PlanModel(name=m.name, served_name=m.served_name, weights=m.weights, max_model_len=m.max_model_len,
                               layers=m.arch.layers) for m in ir.models),
        workloads=tuple(
            PlanWorkload(name=w.name, model=w.model, input_tokens=w.input_tokens, output_tokens=w.output_tokens,
                         demand=w.demand, demand_kind=w.demand_kind, served_requests_per_s=served[w.name],
                         slo=slo_doc(ir, w, tails) if (w.ttft_slo or w.tpot_slo) else None,
                         predicted=(pred := tails.at(w.name, PERCENTILES["p99"])),
                         simulated=simulated_tail(ir, w.name, pred))
            for w in ir.workloads
        ),
        engine=EngineSettings(max_num_seqs=ir.engine.max_num_seqs, gpu_memory_utilization=ir.engine.gpu_memory_utilization,
                              port=ir.engine.port, router_port=ir.engine.router_port),
        nodes=tuple(PlanNode(id=n.id, offer=n.offer, region=n.region, cloud=n.cloud, gpu=n.gpu, gpus=n.gpus,
                             owned_gpus=n.owned_gpus, owned=n.owned, price_per_hour=n.price_per_s * 3600) for n in ir.nodes),
        replicas=tuple(replica_doc(ir, r) for r in ir.replicas),
        routing=routing,
        groups=plan_groups(ir, routing) or None,
        aggregated=ir.aggregated,
        totals=totals(ir),
        passes=tuple(PassSummary(name=p.name, status=p.status, objective=p.objective, bound=p.bound, gap=p.gap, notes=p.notes)
                     for p in ir.reports),
        placement=ir.placements,
        primary_workers=ir.primary_workers or None,
        max_utilization=ir.max_utilization,
        max_ttft_slowdown=ir.max_ttft_slowdown,
        verification=ir.verification,
        next_replica=next_replica(ir),
        prices=tuple(PlanPrice(offer=o.id, gpu=o.gpu, region=o.region, cloud=o.cloud, price_per_gpu_hour=o.price_per_gpu_s * 3600,
                               source=o.price_source) for o in ir.offers),
        warnings=tuple(_relative_warning(w) for w in ir.warnings),
        what_it_would_take=ir.composition.what_if,
        alternatives=ir.composition.alternatives,
        observed=ir.observed,
    )


def plan_groups(ir: Problem, routing: dict[str, dict[str, float]]) -> tuple[PlanGroup, ...]:
    """The routing table's disaggregated groups as plan.json states them, with each one's KV transfer."""
    assert ir.routing is not None and ir.replicas is not None and ir.perf is not None
    reps = {r.id: r for r in ir.replicas}
    out = []
    for g in ir.routing.groups:
        d0 = reps[g.decode[0].replica]
        w = next(w for w, x in sorted(routing.items()) if x.get(d0.id, 0.0) > 0)
        out.append(PlanGroup(id=g.id, workload=w, model=d0.model, prefill={x.replica: x.weight for x in g.prefill},
                             decode={x.replica: x.weight for x in g.decode},
                             transfer_s=transfer_seconds(ir, ir.perf, w, d0.stages[0].region)))
    return tuple(out)


def _relative_warning(w: str) -> str:
    """A warning's location as the spec's file name: plan.json bytes must not depend on where the
    spec was built from (the CLI prints the full path)."""
    head, sep, rest = w.partition(": ")
    return (head.rsplit("/", 1)[-1] + sep + rest) if sep and ":" in head else w
