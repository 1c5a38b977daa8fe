"""plan.json: the canonical, byte-stable plan (DESIGN.md §Plan).

Wall-clock times are left out on purpose (they differ run to run); they go to timings.json.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

from hetcompile import __version__
from hetcompile.ir.problem import Problem, Replica


def solver_version() -> str:
    try:
        return f"highspy {version('highspy')}"
    except PackageNotFoundError:  # pragma: no cover
        return "highspy unknown"


def replica_price_per_s(ir: Problem, r: Replica) -> float:
    nodes = {n.id: n for n in ir.nodes}
    return sum(nodes[s.node].price_per_s for s in r.stages)


def workload_rates(ir: Problem) -> dict[str, float]:
    """Requests/s the plan serves per workload: theta * lambda_w."""
    scale = ir.composition.scale
    return {w.name: scale * w.demand for w in ir.workloads}


def totals(ir: Problem) -> dict:
    rates = workload_rates(ir)
    ws = {w.name: w for w in ir.workloads}
    rps = sum(rates.values())
    prompt = sum(v * ws[w].input_tokens for w, v in rates.items())
    output = sum(v * ws[w].output_tokens for w, v in rates.items())
    cost = sum(n.price_per_s for n in ir.nodes)
    compose = next((r for r in ir.reports if r.name == "compose"), None)
    out = {
        "requests_per_s": rps,
        "tokens_per_s": prompt + output,
        "output_tokens_per_s": output,
        "price_per_hour": cost * 3600,
        "budget_per_hour": ir.budget_per_s * 3600 if ir.budget_per_s is not None else None,
        "scale": ir.composition.scale,
        "binding": list(ir.composition.binding),
        "objective": ir.objective,
        "objective_value": compose.objective if compose else None,
        "bound": compose.bound if compose else None,
        "gap": compose.gap if compose else None,
        "gpus": sum(n.gpus for n in ir.nodes),
    }
    if any(w.demand_kind == "requests" for w in ir.workloads):
        out["makespan_s"] = 1.0 / ir.composition.scale
    if cost > 0:
        out["tokens_per_dollar"] = (prompt + output) / cost
    return out


def plan_dict(ir: Problem) -> dict:
    by_model = {m.name: m for m in ir.models}
    replicas = []
    for r in ir.replicas:
        est = r.estimate
        per_w = {}
        for w, rps in est.throughput_rps:
            per_w[w] = {
                "capacity_requests_per_s": rps,
                "concurrency": dict(est.concurrency)[w],
                "binding": dict(est.binding)[w],
                "ttft_s": dict(est.ttft_s).get(w),
                "tpot_s": dict(est.tpot_s).get(w),
            }
        replicas.append(
            {
                "id": r.id,
                "model": r.model,
                "served_name": by_model[r.model].served_name,
                "shape": r.shape,
                "dtype": r.dtype,
                "mixed": r.mixed,
                "tp": r.stages[0].tp,
                "pp": len(r.stages),
                "partition": [s.layers for s in r.stages],
                "stages": [
                    {"node": s.node, "gpu": s.gpu, "region": s.region, "tp": s.tp, "layers": [s.layer_start, s.layer_end]}
                    for s in r.stages
                ],
                "kv_capacity_tokens": est.kv_capacity_tokens,
                "prefill_tokens_per_s": est.prefill_tokens_per_s,
                "decode_tokens_per_s": est.decode_tokens_per_s,
                "estimate_source": est.source,
                "workloads": per_w,
                "price_per_hour": replica_price_per_s(ir, r) * 3600,
            }
        )
    routing = {}
    out_placement = [p.model_dump(mode="json") for p in ir.placements]
    for m in ir.routing.models:
        for c in m.classes:
            routing[c.name] = {w.replica: w.weight for w in c.weights}
    return {
        "compiler": {"name": "hetcompile", "version": __version__, "solver": solver_version()},
        "plan": ir.name,
        "spec_hash": ir.spec_hash,
        "models": [
            {"name": m.name, "served_name": m.served_name, "weights": m.weights, "max_model_len": m.max_model_len, "layers": m.arch.layers}
            for m in ir.models
        ],
        "workloads": [
            {
                "name": w.name, "model": w.model, "input_tokens": w.input_tokens, "output_tokens": w.output_tokens,
                "demand": w.demand, "demand_kind": w.demand_kind, "served_requests_per_s": workload_rates(ir)[w.name],
            }
            for w in ir.workloads
        ],
        "nodes": [
            {"id": n.id, "offer": n.offer, "region": n.region, "cloud": n.cloud, "gpu": n.gpu, "gpus": n.gpus,
             "price_per_hour": n.price_per_s * 3600, "owned": n.owned}
            for n in ir.nodes
        ],
        "replicas": replicas,
        "routing": routing,
        "totals": totals(ir),
        "passes": [
            {"name": p.name, "status": p.status, "objective": p.objective, "bound": p.bound, "gap": p.gap, "notes": list(p.notes)}
            for p in ir.reports
        ],
        **({"placement": out_placement} if out_placement else {}),
    }


def timings_dict(ir: Problem) -> dict:
    return {"passes": [{"name": p.name, "time_s": round(p.time_s, 4)} for p in ir.reports]}
