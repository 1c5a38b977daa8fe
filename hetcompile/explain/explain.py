"""plan dict -> `Explanation`: load, bottlenecks, what binds, cost, bound and gap, estimate sources.

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

from hetcompile.ir import human
from collections import defaultdict

from hetcompile.explain import rates
from hetcompile.explain.model import (
    Bottleneck, CostBreakdown, EstimateGroup, Explanation, OfferCost, PassView, PlanBinding, RegionCost,
    ReplicaLoad, ReplicaView, SolverView, StageView, Summary, WorkloadView,
)

ESTIMATE_TEXT = {
    "analytic": "datasheet model (hetcompile/perf/analytic.py): memory, FLOPs and bandwidth of each GPU",
    "measured": "measured throughput from the spec's `profiles` (KV and token rates as given there)",
}


def _hops(replica: dict) -> tuple[str, ...]:
    st = replica.get("stages", [])
    return tuple(f"{a.get('region')}->{b.get('region')}" for a, b in zip(st, st[1:]))


def _balanced(work: list[float]) -> bool:
    return len(work) > 1 and max(work) - min(work) <= 1e-9 * max(work)


def _heaviest(work: list[float]) -> int:
    return max(range(len(work)), key=lambda i: (work[i], -i)) if work else 0


def bottleneck(replica: dict, binding: str | None, work: list[float] | None = None) -> Bottleneck:
    """What bounds `replica` for a workload whose profile says `binding` (module docstring); `work`:
    the stages' step times (rates.stage_times)."""
    st = replica.get("stages", [])
    b = binding or "unknown"
    work = work if work is not None else [rates.stage_work(s) for s in st]
    if b == "bottleneck-stage" or b.startswith("stage:"):
        i = _heaviest(work)
        s = st[i] if st else {}
        lay = s.get("layers", [0, 0])
        text = f"stage {i} ({s.get('gpu')} tp{s.get('tp')} in {s.get('region')}, layers {lay[0]}-{lay[1]}) paces decode"
        if _balanced(work):
            text += "; the stages are balanced, so every stage is as slow"
        return Bottleneck(kind="stage", stage=i, text=text)
    if b in ("depth", "latency"):
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
        return Bottleneck(kind="other", text=what.get(b, f"the workload's SLO: {b.removeprefix('slo-')}"))
    if b == "measured":
        return Bottleneck(kind="measured", text="a measured profile gives the capacity; what binds is not modelled")
    return Bottleneck(kind="other", text=f"binding term {b!r}")


def _limit(binding: str | None) -> str:
    if binding in ("bottleneck-stage", "depth", "latency") or (binding or "").startswith("stage:"):
        return "kv-memory"
    if binding == "max-num-seqs":
        return "max-num-seqs"
    return "measured" if binding == "measured" else "unknown"


def chain_placement(plan: dict, r: dict) -> dict | None:
    """The replica's own `placement` dict, else its chain in the plan's placement block (a list of
    per-model results with `chains`, or one such dict), else None."""
    if isinstance(r.get("placement"), dict):
        return r["placement"]
    block = plan.get("placement")
    for m in block if isinstance(block, list) else [block] if isinstance(block, dict) else []:
        if not isinstance(m, dict) or m.get("model", r["model"]) != r["model"]:
            continue
        for c in m.get("chains") or []:
            if isinstance(c, dict) and c.get("replica") == r["id"]:
                return {k: v for k, v in c.items() if k != "replica"}
    return None


def replica_view(plan: dict, r: dict) -> ReplicaView:
    nodes = rates.node_index(plan)
    u = rates.utilisation(plan, r)
    x = rates.routed(plan, r)
    work = rates.stage_times(plan, r)  # t_i from the step model: the bottleneck is the slowest stage
    loads = []
    for w in sorted(set(x) | set(r.get("workloads") or {})):
        e = (r.get("workloads") or {}).get(w) or {}
        h = rates.capacity(r, w)
        xw = x.get(w, 0.0)
        loads.append(ReplicaLoad(
            workload=w, weight=rates.weight(plan, w, r["id"]), routed_requests_per_s=xw, capacity_requests_per_s=h,
            time_share=(xw / h if h else (1.0 if xw > rates.EPS else 0.0)), concurrency=e.get("concurrency"),
            concurrency_limit=_limit(e.get("binding")), bottleneck=bottleneck(r, e.get("binding"), work),
            ttft_s=e.get("ttft_s"), tpot_s=e.get("tpot_s"),
        ))
    main = max(loads, key=lambda ld: ld.time_share, default=None)  # ties: the first by name
    top = max(work, default=0.0)
    heavy = _heaviest(work)
    balanced = _balanced(work)  # no stage is heavier: none is marked
    stages = tuple(
        StageView(
            index=i, node=s.get("node", "?"), offer=nodes.get(s.get("node"), {}).get("offer"), gpu=s.get("gpu", "?"),
            region=s.get("region", "?"), tp=int(s.get("tp") or 1), layers=tuple(s.get("layers", [0, 0])),
            work_share=(work[i] / top if top else 0.0), utilisation=(u * work[i] / top if top else 0.0),
            bottleneck=(i == heavy and not balanced),
        )
        for i, s in enumerate(r.get("stages", []))
    )
    regions = tuple(dict.fromkeys(s.region for s in stages))
    return ReplicaView(
        id=r["id"], model=r["model"], shape=r.get("shape"), gpu="+".join(dict.fromkeys(s.gpu for s in stages)),
        regions=regions, tp=r.get("tp"), pp=len(stages), gpus=rates.replica_gpus(r), price_per_hour=rates.replica_price(plan, r),
        kv_capacity_tokens=r.get("kv_capacity_tokens"), estimate_source=str(r.get("estimate_source", "unknown")),
        utilisation=u, bottleneck=main.bottleneck if main else bottleneck(r, None, work), stages=stages, workloads=tuple(loads),
        placement=chain_placement(plan, r),
    )


def parse_binding(b: dict) -> PlanBinding:
    """One structured entry of totals.binding (ir/problem.py `Binding`), as explain shows it."""
    kind = b.get("kind", "other")
    known = ("budget", "availability", "demand", "placement", "slo")
    return PlanBinding(kind=kind if kind in known else "other", subject=b.get("subject"), derived=False,
                       text=str(b.get("text", "")))


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


def cost_breakdown(plan: dict) -> CostBreakdown:
    t = plan.get("totals", {})
    used = {s.get("node") for r in plan["replicas"] for s in r.get("stages", [])}
    offers: dict[str, list[dict]] = defaultdict(list)
    regions: dict[str, list[dict]] = defaultdict(list)
    for n in plan["nodes"]:
        offers[n.get("offer", "?")].append(n)
        regions[n.get("region", "?")].append(n)
    total = sum(float(n.get("price_per_hour") or 0.0) for n in plan["nodes"])

    def share(p: float) -> float:
        return p / total if total > 0 else 0.0

    sources = {q.get("offer"): q.get("source") for q in plan.get("prices") or ()}
    by_offer = []
    for o, ns in sorted(offers.items()):
        p = sum(float(n.get("price_per_hour") or 0.0) for n in ns)
        by_offer.append(OfferCost(
            offer=o, gpu=ns[0].get("gpu", "?"), region=ns[0].get("region", "?"), cloud=ns[0].get("cloud"),
            owned=bool(ns[0].get("owned")), nodes=len(ns), gpus=sum(int(n.get("gpus") or 0) for n in ns),
            price_per_hour=p, share=share(p), price_source=sources.get(o),
        ))
    by_region = []
    for g, ns in sorted(regions.items()):
        p = sum(float(n.get("price_per_hour") or 0.0) for n in ns)
        by_region.append(RegionCost(region=g, nodes=len(ns), gpus=sum(int(n.get("gpus") or 0) for n in ns),
                                    price_per_hour=p, share=share(p)))
    budget = t.get("budget_per_hour")
    price = t.get("price_per_hour", total)
    return CostBreakdown(
        price_per_hour=price, budget_per_hour=budget, budget_left_per_hour=None if budget is None else budget - price,
        owned_gpus=sum(int(n.get("gpus") or 0) for n in plan["nodes"] if n.get("owned")),
        rented_gpus=sum(int(n.get("gpus") or 0) for n in plan["nodes"] if not n.get("owned")),
        idle_nodes=tuple(sorted(n["id"] for n in plan["nodes"] if n["id"] not in used)),
        by_offer=tuple(by_offer), by_region=tuple(by_region),
    )


def solver_view(plan: dict) -> SolverView:
    t = plan.get("totals", {})
    gap, bound = t.get("gap"), t.get("bound")
    if bound is None:
        text = "no proven bound: the solver gave none"
    elif gap is not None and gap <= 1e-5:  # plan.json rounds to 6 significant digits: below that is rounding
        text = f"proven optimal: no plan within the spec's limits scores above {human.number(bound, 6)}"
    else:
        pct = "unknown" if gap is None else f"{100 * gap:.3g}%"
        text = f"no plan scores above {human.number(bound, 6)}; this one is within {pct} of that bound"
    passes = tuple(
        PassView(name=p.get("name", "?"), status=str(p.get("status")), objective=p.get("objective"), bound=p.get("bound"),
                 gap=p.get("gap"), notes=tuple(p.get("notes") or ()))
        for p in plan.get("passes", [])
    )
    return SolverView(objective=t.get("objective"), objective_value=t.get("objective_value"), bound=bound, gap=gap,
                      text=text, passes=passes)


def workload_views(plan: dict) -> tuple[WorkloadView, ...]:
    cap = rates.plan_capacity(plan)
    out = []
    for w in sorted(plan.get("workloads", []), key=lambda w: w["name"]):
        name = w["name"]
        out.append(WorkloadView(
            name=name, model=w.get("model"), demand=w.get("demand"), demand_kind=w.get("demand_kind"),
            input_tokens=w.get("input_tokens"), output_tokens=w.get("output_tokens"),
            served_requests_per_s=float(w.get("served_requests_per_s") or 0.0), capacity_requests_per_s=cap.get(name, 0.0),
            replicas=tuple(sorted(r["id"] for r in plan["replicas"] if rates.weight(plan, name, r["id"]) > rates.EPS)),
            ttft_s=rates.mean_latency(plan, name, "ttft_s"), tpot_s=rates.mean_latency(plan, name, "tpot_s"),
        ))
    return tuple(out)


def notes(plan: dict, views: tuple[ReplicaView, ...], cost: CostBreakdown) -> tuple[str, ...]:
    out = []
    for v in views:
        if v.utilisation > 1 + 1e-4:  # plan.json rounds to 6 digits; a full replica reads 1.00001
            out.append(f"{v.id} is routed {human.number(v.utilisation, 3)}x its capacity: it will queue")
        elif v.utilisation <= rates.EPS:
            out.append(f"{v.id} is routed no traffic")
    if cost.idle_nodes:
        out.append(f"nodes paid for but unused: {', '.join(cost.idle_nodes)}")
    known = set(rates.served(plan))
    for w in sorted(set(plan.get("routing") or {}) - known):
        out.append(f"routing class {w!r} names no workload of the plan")
    return tuple(out)


def what_it_would_take(plan: dict) -> tuple[str, ...]:
    """plan.json's what_it_would_take block as lines: its sentences, then one per marginal."""
    wt = plan.get("what_it_would_take") or {}
    return tuple(str(x) for x in wt.get("text") or ()) + tuple(str(m.get("text")) for m in wt.get("marginals") or ())


def alternatives(plan: dict) -> tuple[str, ...]:
    """plan.json's alternatives block as lines: one per frontier point, then the runners-up."""
    alt = plan.get("alternatives") or {}
    out = []
    for q in alt.get("frontier") or ():
        tpot = f", mean TPOT {1e3 * q['tpot_s']:.0f} ms" if q.get("tpot_s") is not None else ""
        mark = " **(this plan)**" if q.get("this_plan") else ""
        front = "" if q.get("pareto", True) else " (dominated)"
        out.append(f"budget {human.money(q['budget_per_hour'])}: {human.money(q['price_per_hour'])}, "
                   f"{human.number(q['requests_per_s'])} req/s ({human.percent(q['scale'])} of the demand){tpot}{mark}{front}")
    out += [f"runner-up {r['text']}" for r in alt.get("runners_up") or ()]
    return tuple(out)


def explain_plan(plan: dict) -> Explanation:
    """Why `plan` looks the way it does (a pure function of the plan dict)."""
    t = plan.get("totals", {})
    views = tuple(replica_view(plan, r) for r in sorted(plan["replicas"], key=lambda r: r["id"]))
    cost = cost_breakdown(plan)
    groups: dict[str, list[str]] = defaultdict(list)
    for v in views:
        groups[v.estimate_source].append(v.id)
    return Explanation(
        plan=str(plan.get("plan")), spec_hash=plan.get("spec_hash"),
        models=tuple(sorted({m.get("name") for m in plan.get("models", [])} | {r["model"] for r in plan["replicas"]})),
        summary=Summary(
            requests_per_s=t.get("requests_per_s"), tokens_per_s=t.get("tokens_per_s"),
            output_tokens_per_s=t.get("output_tokens_per_s"), price_per_hour=t.get("price_per_hour"),
            budget_per_hour=t.get("budget_per_hour"), gpus=int(t.get("gpus") or sum(int(n.get("gpus") or 0) for n in plan["nodes"])),
            nodes=len(plan["nodes"]), replicas=len(views), makespan_s=t.get("makespan_s"),
        ),
        binding=tuple(parse_binding(b) for b in t.get("binding", [])) + tuple(derived_bindings(views)),
        workloads=workload_views(plan), replicas=views, cost=cost, solver=solver_view(plan),
        estimates=tuple(EstimateGroup(source=s, replicas=tuple(ids), text=ESTIMATE_TEXT.get(s, "not described by this version"))
                        for s, ids in sorted(groups.items())),
        placement=plan.get("placement"),
        primary_workers=plan.get("primary_workers"),
        notes=notes(plan, views, cost),
        what_it_would_take=what_it_would_take(plan),
        alternatives=alternatives(plan),
    )
