"""PlanDoc -> `Explanation`: load, bottlenecks, what binds, cost, bound and gap, estimate sources.

Every number is read or derived from plan.json (notation in rates.py); nothing is recomputed
from catalogs, so explain reads a plan without the spec that made it.

Bottleneck of a chain, from the per-workload `binding` the profile pass records
(perf/capacity.py: tau = max(max_i t_i, (sum_i t_i + hops) / d)):

    bottleneck-stage  the slowest stage paces decode -> the stage with the largest step time t_i of
                      the replica's step model (rates.stage_times; layers / tp without one)
    depth             the round trip binds: C/d sequences per micro-batch cannot hide d stages plus
                      d - 1 hops; with balanced stages only the hops make it so -> the links
    max-num-seqs      C hit the engine's --max-num-seqs before the KV cache ran out
    measured          a measured profile: its number, no model of why
    stage:<unit> / latency   the same two cases as written by the placement pass
"""

from __future__ import annotations

from hetcompile.plan.groups import group_picture, versus
from hetcompile.plan import human
from collections import defaultdict

from hetcompile.explain import rates
from hetcompile.plan.doc import PlanDoc, PlanNode, PlanReplica
from hetcompile.plan.doc import Binding
from hetcompile.explain.model import (
    Bottleneck, CostBreakdown, EstimateGroup, Explanation, OfferCost, PassView, PlanBinding, RegionCost,
    ReplicaLoad, ReplicaView, SolverView, StageView, Summary, WorkloadView,
)

ESTIMATE_TEXT = {
    "analytic": "memory from datasheets; step times from NVIDIA's measured vLLM kernel tables where the GPU has them "
                "(perf/kernels.py: H100, H200, L40S, A100-80GB), else the datasheet roofline at bounded efficiencies",
    "measured": "measured throughput from the spec's `profiles` (KV and token rates as given there)",
}


def _hops(replica: PlanReplica) -> tuple[str, ...]:
    st = replica.stages
    return tuple(f"{a.region}->{b.region}" for a, b in zip(st, st[1:]))


def _balanced(work: list[float]) -> bool:
    return len(work) > 1 and max(work) - min(work) <= 1e-9 * max(work)


def _heaviest(work: list[float]) -> int:
    return max(range(len(work)), key=lambda i: (work[i], -i)) if work else 0


def bottleneck(replica: PlanReplica, binding: str | None, work: list[float] | None = None,
               reason: str | None = None) -> Bottleneck:
    """What bounds `replica` for a workload whose profile says `binding` (module docstring); `work`:
    the stages' step times (rates.stage_times)."""
    st = replica.stages
    b = binding or "unknown"
    work = work if work is not None else [rates.stage_work(s) for s in st]
    if b == "bottleneck-stage":
        i = _heaviest(work)
        gpu, tp, region, lay = (st[i].gpu, st[i].tp, st[i].region, st[i].layers) if st else (None, None, None, (0, 0))
        text = f"stage {i} ({gpu} tp{tp} in {region}, layers {lay[0]}-{lay[1]}) paces decode"
        if _balanced(work):
            text += "; the stages are balanced, so every stage is as slow"
        return Bottleneck(kind="stage", stage=i, text=text)
    if b == "depth":
        hops = _hops(replica)
        cross = sorted({h for h in hops if h.split("->")[0] != h.split("->")[1]})
        where = f"cross-region {', '.join(cross)}" if cross else "inside the region"
        text = (f"the pipeline round trip: {len(st)} stages and {human.plural(len(hops), 'hop')} ({where}) with C/{len(st)} "
                "sequences per micro-batch; fewer stages or faster links would raise it") if hops else \
            "the round trip of the single stage"
        return Bottleneck(kind="hops", hops=hops, text=text)
    if b == "max-num-seqs":
        return Bottleneck(kind="max-num-seqs", text="the engine's --max-num-seqs caps concurrency; the KV cache holds more")
    if b.startswith("slo-"):
        what = {"slo-tpot": "the workload's TPOT target (p99 bound) caps the concurrency",
                "slo-ttft": "the workload's TTFT target caps the load (queueing for the prefill)"}
        text = what.get(b, f"the workload's SLO: {b.removeprefix('slo-')}")
        return Bottleneck(kind="other", text=f"{text} ({reason})" if reason else text)
    if b == "measured":
        return Bottleneck(kind="measured", text="a measured profile gives the capacity; what binds is not modelled")
    if b == "queueing":
        text = "the queueing bound caps the load (no SLO: p99 TTFT within max_ttft_slowdown x the idle TTFT)"
        return Bottleneck(kind="other", text=f"{text} ({reason})" if reason else text)
    return Bottleneck(kind="other", text=f"binding term {b!r}")


def _limit(binding: str | None) -> str:
    if binding in ("bottleneck-stage", "depth"):
        return "kv-memory"
    if binding == "max-num-seqs":
        return "max-num-seqs"
    return "measured" if binding == "measured" else "unknown"


def chain_placement(plan: PlanDoc, r: PlanReplica) -> dict | None:
    """The replica's chain in the plan's placement block (its `ChainSummary` as plan.json has it,
    less the replica id), else None."""
    for m in plan.placement:
        if m.model != r.model:
            continue
        for c in m.chains:
            if c.replica == r.id:
                return c.model_dump(mode="json", exclude={"replica"})
    return None


def replica_view(plan: PlanDoc, r: PlanReplica) -> ReplicaView:
    nodes = rates.node_index(plan)
    u = rates.utilisation(plan, r)
    x = rates.routed(plan, r)
    work = rates.stage_times(plan, r)  # t_i from the step model: the bottleneck is the slowest stage
    loads = []
    for w in sorted(set(x) | set(r.workloads)):
        e = rates.estimate(r, w)
        binding = e.binding if e else None
        h = rates.capacity(r, w)
        xw = x[w] if w in x else 0.0
        loads.append(ReplicaLoad(
            workload=w, weight=rates.weight(plan, w, r.id), routed_requests_per_s=xw, capacity_requests_per_s=h,
            time_share=(xw / h if h else (1.0 if xw > rates.EPS else 0.0)), concurrency=e.concurrency if e else None,
            concurrency_limit=_limit(binding), bottleneck=bottleneck(r, binding, work, e.binding_reason if e else None),
            ttft_s=e.ttft_s if e else None, tpot_s=e.tpot_s if e else None,
        ))
    main = max(loads, key=lambda ld: ld.time_share, default=None)  # ties: the first by name
    top = max(work, default=0.0)
    heavy = _heaviest(work)
    balanced = _balanced(work)  # no stage is heavier: none is marked
    stages = tuple(
        StageView(
            index=i, node=s.node, offer=rates.stage_offer(nodes, s), gpu=s.gpu, region=s.region, tp=s.tp or 1,
            layers=s.layers, work_share=(work[i] / top if top else 0.0), utilisation=(u * work[i] / top if top else 0.0),
            bottleneck=(i == heavy and not balanced),
        )
        for i, s in enumerate(r.stages)
    )
    regions = tuple(dict.fromkeys(s.region for s in stages))
    return ReplicaView(
        id=r.id, model=r.model, shape=r.shape, gpu="+".join(dict.fromkeys(s.gpu for s in stages)),
        regions=regions, tp=r.tp, pp=len(stages), gpus=rates.replica_gpus(r), price_per_hour=rates.replica_price(plan, r),
        kv_capacity_tokens=r.kv_capacity_tokens, estimate_source=r.estimate_source,
        utilisation=u, bottleneck=main.bottleneck if main else bottleneck(r, None, work), stages=stages, workloads=tuple(loads),
        placement=chain_placement(plan, r),
    )


def parse_binding(b: Binding) -> PlanBinding:
    """One structured entry of totals.binding (ir/problem.py `Binding`), as explain shows it."""
    return PlanBinding(kind=b.kind, subject=b.subject, derived=False, text=b.text)


def _ids(ids: list[str]) -> str:
    return ", ".join(ids)


def derived_bindings(views: tuple[ReplicaView, ...]) -> list[PlanBinding]:
    """Chain-level limits shared by many replicas: KV memory, the engine cap, cross-region links."""
    by: dict[str, list[str]] = defaultdict(list)
    for v in views:
        for ld in v.workloads:
            if ld.time_share > rates.EPS or not any(x.time_share > rates.EPS for x in v.workloads):
                by[ld.concurrency_limit].append(v.id)
                if ld.bottleneck.kind == "hops" and any(h.split("->")[0] != h.split("->")[1] for h in ld.bottleneck.hops):
                    by["link"].append(v.id)
    out = []
    if by["kv-memory"]:
        ids = sorted(set(by["kv-memory"]))
        out.append(PlanBinding(kind="memory", subject=_ids(ids), derived=True,
                               text=f"memory: the KV cache caps concurrency C on {_ids(ids)}"))
    if by["max-num-seqs"]:
        ids = sorted(set(by["max-num-seqs"]))
        out.append(PlanBinding(kind="engine", subject=_ids(ids), derived=True,
                               text=f"engine: --max-num-seqs caps concurrency C on {_ids(ids)} (KV has room)"))
    if by["link"]:
        ids = sorted(set(by["link"]))
        out.append(PlanBinding(kind="link", subject=_ids(ids), derived=True,
                               text=f"link: cross-region hops bound the pipeline round trip of {_ids(ids)}"))
    return out


def cost_breakdown(plan: PlanDoc) -> CostBreakdown:
    t = plan.totals
    used = {s.node for r in plan.replicas for s in r.stages}
    offers: dict[str, list[PlanNode]] = defaultdict(list)
    regions: dict[str, list[PlanNode]] = defaultdict(list)
    for n in plan.nodes:
        offers[n.offer].append(n)
        regions[n.region].append(n)
    total = sum(n.price_per_hour for n in plan.nodes)

    def share(p: float) -> float:
        return p / total if total > 0 else 0.0

    sources = {q.offer: q.source for q in plan.prices}
    by_offer = []
    for o, ns in sorted(offers.items()):
        p = sum(n.price_per_hour for n in ns)
        by_offer.append(OfferCost(
            offer=o, gpu=ns[0].gpu, region=ns[0].region, cloud=ns[0].cloud, owned=ns[0].owned, nodes=len(ns),
            gpus=sum(n.gpus for n in ns), price_per_hour=p, share=share(p), price_source=sources.get(o),
        ))
    by_region = []
    for g, ns in sorted(regions.items()):
        p = sum(n.price_per_hour for n in ns)
        by_region.append(RegionCost(region=g, nodes=len(ns), gpus=sum(n.gpus for n in ns), price_per_hour=p, share=share(p)))
    budget = t.budget_per_hour
    price = t.price_per_hour
    return CostBreakdown(
        price_per_hour=price, budget_per_hour=budget, budget_left_per_hour=None if budget is None else budget - price,
        owned_gpus=sum(n.gpus for n in plan.nodes if n.owned),
        rented_gpus=sum(n.gpus for n in plan.nodes if not n.owned),
        idle_nodes=tuple(sorted(n.id for n in plan.nodes if n.id not in used)),
        by_offer=tuple(by_offer), by_region=tuple(by_region),
    )


def solver_view(plan: PlanDoc) -> SolverView:
    t = plan.totals
    gap, bound = t.gap, t.bound
    if bound is None:
        text = "no proven bound: the solver gave none"
    elif gap is not None and gap <= 1e-5:  # plan.json rounds to 6 significant digits: below that is rounding
        text = f"proven optimal: no plan within the spec's limits scores above {human.number(bound, 6)}"
    else:
        pct = "unknown" if gap is None else f"{100 * gap:.3g}%"
        text = f"no plan scores above {human.number(bound, 6)}; this one is within {pct} of that bound"
    passes = tuple(
        PassView(name=p.name, status=p.status, objective=p.objective, bound=p.bound, gap=p.gap, notes=p.notes)
        for p in plan.passes
    )
    return SolverView(objective=t.objective, objective_value=t.objective_value, bound=bound, gap=gap, text=text, passes=passes)


def workload_views(plan: PlanDoc) -> tuple[WorkloadView, ...]:
    cap = rates.plan_capacity(plan)
    out = []
    for w in sorted(plan.workloads, key=lambda w: w.name):
        name = w.name
        out.append(WorkloadView(
            name=name, model=w.model, demand=w.demand, demand_kind=w.demand_kind,
            input_tokens=w.input_tokens, output_tokens=w.output_tokens,
            served_requests_per_s=w.served_requests_per_s, capacity_requests_per_s=cap[name],
            replicas=tuple(sorted(r.id for r in plan.replicas if rates.weight(plan, name, r.id) > rates.EPS)),
            ttft_s=rates.planned_latency(plan, name, "ttft_s"), tpot_s=rates.planned_latency(plan, name, "tpot_s"),
        ))
    return tuple(out)


def notes(plan: PlanDoc, views: tuple[ReplicaView, ...], cost: CostBreakdown) -> tuple[str, ...]:
    out = []
    for v in views:
        if v.utilisation > 1 + 1e-4:  # plan.json rounds to 6 digits; a full replica reads 1.00001
            out.append(f"{v.id} is routed {human.number(v.utilisation, 3)}x its capacity: it will queue")
        elif v.utilisation <= rates.EPS:
            out.append(f"{v.id} is routed no traffic")
    if cost.idle_nodes:
        out.append(f"nodes paid for but unused: {', '.join(cost.idle_nodes)}")
    known = set(rates.served(plan))
    for w in sorted(set(plan.routing) - known):
        out.append(f"routing class {w!r} names no workload of the plan")
    return tuple(out)


def what_it_would_take(plan: PlanDoc) -> tuple[str, ...]:
    """plan.json's what_it_would_take block as lines: its sentences, then one per marginal."""
    wt = plan.what_it_would_take
    return () if wt is None else tuple(wt.text) + tuple(m.text for m in wt.marginals)


def alternatives(plan: PlanDoc) -> tuple[str, ...]:
    """plan.json's alternatives block as lines: one per frontier point, then the runners-up."""
    alt = plan.alternatives
    if alt is None:
        return ()
    out = []
    for q in alt.frontier:
        tpot = f", mean TPOT {1e3 * q.tpot_s:.0f} ms" if q.tpot_s is not None else ""
        mark = " **(this plan)**" if q.this_plan else ""
        front = "" if q.pareto else " (dominated)"
        out.append(f"budget {human.money(q.budget_per_hour)}: {human.money(q.price_per_hour)}, "
                   f"{human.number(q.requests_per_s)} req/s ({human.percent(q.scale)} of the demand){tpot}{mark}{front}")
    out += [f"runner-up {r.text}" for r in alt.runners_up]
    return tuple(out)


def explain_plan(plan: PlanDoc) -> Explanation:
    """Why `plan` looks the way it does (a pure function of the plan document)."""
    t = plan.totals
    views = tuple(replica_view(plan, r) for r in sorted(plan.replicas, key=lambda r: r.id))
    cost = cost_breakdown(plan)
    groups: dict[str, list[str]] = defaultdict(list)
    for v in views:
        groups[v.estimate_source].append(v.id)
    return Explanation(
        plan=plan.plan, spec_hash=plan.spec_hash,
        models=tuple(sorted({m.name for m in plan.models} | {r.model for r in plan.replicas})),
        summary=Summary(
            requests_per_s=t.requests_per_s, tokens_per_s=t.tokens_per_s, output_tokens_per_s=t.output_tokens_per_s,
            price_per_hour=t.price_per_hour, budget_per_hour=t.budget_per_hour,
            gpus=t.gpus or sum(n.gpus for n in plan.nodes), nodes=len(plan.nodes), replicas=len(views), makespan_s=t.makespan_s,
        ),
        binding=tuple(parse_binding(b) for b in t.binding) + tuple(derived_bindings(views)),
        workloads=workload_views(plan), replicas=views, cost=cost, solver=solver_view(plan),
        estimates=tuple(EstimateGroup(source=s, replicas=tuple(ids), text=ESTIMATE_TEXT.get(s, "not described by this version"))
                        for s, ids in sorted(groups.items())),
        placement=plan.placement,  # typed: json output serializes them as plan.json has them
        primary_workers=plan.primary_workers,
        notes=notes(plan, views, cost),
        what_it_would_take=what_it_would_take(plan),
        alternatives=alternatives(plan),
        disaggregation=tuple(group_picture(plan, g) for g in plan.groups or ()) + tuple(versus(plan)),
    )
