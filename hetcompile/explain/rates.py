"""The load arithmetic of a plan: routed rates, utilisation, capacity at the planned mix.

Notation (all read from plan.json as a `PlanDoc`; r a replica, w a workload, P a plan):

    s_w       served requests/s of w            workloads[].served_requests_per_s
    p_{r,w}   routing weight of r in class w    routing[w][r]            (sum_r p_{r,w} = 1)
    h_{r,w}   capacity of r serving only w      replicas[].workloads[w].capacity_requests_per_s
    x_{r,w} = p_{r,w} s_w                       requests/s of w routed to r
    U_r     = sum_w x_{r,w} / h_{r,w}           utilisation: the share of r's time busy (compose
                                                keeps it <= 1: seed 003's sum_w r_{c,w}/h_{c,w} <= y_c)
    k_{r,w} = x_{r,w} / U_r                     what r serves of w at full load, keeping its mix
    K_w(S)  = sum_{r in S} k_{r,w}              capacity of a set S of replicas for w

K_w is additive over replicas and never falls when a replica is added, which is what a rolling
migration needs to count capacity step by step; K_w(all replicas of P) >= s_w, with equality
when every replica is fully used (max-throughput plans).

Stages: a replica's stages run the same request stream; stage i's share of the work is taken as
l_i = layers_i / tp_i (same-type stages: time per token is proportional to layers over TP), and
its utilisation is U_r l_i / max_j l_j. plan.json has no per-stage times, so this is the one
approximation here; a `placement` block with stage times would replace it.
"""

from __future__ import annotations

from typing import Iterable

from hetcompile.plan.doc import PlanDoc, PlanNode, PlanReplica, PlanStage, ReplicaWorkload

EPS = 1e-12


def weight(plan: PlanDoc, w: str, r: str) -> float:
    """p_{r,w}: 0 when the class does not list the replica."""
    row = plan.routing[w] if w in plan.routing else {}
    return row[r] if r in row else 0.0


def served(plan: PlanDoc) -> dict[str, float]:
    """s_w for every workload of the plan."""
    return {w.name: w.served_requests_per_s for w in plan.workloads}


def estimate(replica: PlanReplica, w: str) -> ReplicaWorkload | None:
    """The replica's estimate for workload w, None when it has none."""
    return replica.workloads[w] if w in replica.workloads else None


def capacity(replica: PlanReplica, w: str) -> float | None:
    """h_{r,w}, None when the replica has no estimate for w."""
    e = estimate(replica, w)
    return None if e is None else e.capacity_requests_per_s


def routed(plan: PlanDoc, replica: PlanReplica) -> dict[str, float]:
    """x_{r,w} for every workload of the plan (0 where not routed). A prefill replica of a
    disaggregated group runs the prompts of what its group's decode replicas are routed, by its
    share of the group's prefills."""
    g = next((g for g in plan.groups or () if replica.id in g.prefill), None)
    if g is not None:
        share = g.prefill[replica.id]
        return {w: share * sum(weight(plan, w, d) for d in g.decode) * s for w, s in sorted(served(plan).items())}
    return {w: weight(plan, w, replica.id) * s for w, s in sorted(served(plan).items())}


def utilisation(plan: PlanDoc, replica: PlanReplica) -> float:
    """U_r at the planned rates (PlanReplica.load); a routed workload without an estimate counts as
    fully using the replica."""
    return replica.load(routed(plan, replica), EPS)


def full_load(plan: PlanDoc, replica: PlanReplica) -> dict[str, float]:
    """k_{r,w}: the replica's planned mix scaled to full load (all 0 when it is routed nothing)."""
    x = routed(plan, replica)
    u = utilisation(plan, replica)
    return {w: (v / u if u > EPS else 0.0) for w, v in x.items()}


def plan_capacity(plan: PlanDoc, replicas: Iterable[PlanReplica] | None = None) -> dict[str, float]:
    """K_w(S) for S = `replicas` (default: all of the plan's)."""
    out = {w: 0.0 for w in served(plan)}
    for r in plan.replicas if replicas is None else replicas:
        for w, k in full_load(plan, r).items():
            out[w] += k
    return out


def stage_work(stage: PlanStage) -> float:
    """l_i = layers / tp (the stand-in when a replica carries no step model)."""
    s, e = stage.layers
    return (e - s) / max(stage.tp, 1)


def stage_times(plan: PlanDoc, replica: PlanReplica) -> list[float]:
    """t_i: seconds of one micro-batch step on each stage, from the replica's step model (the one the
    capacity formula and the simulator use), at its mean workload (the plan's workloads of its model,
    weighted by demand) in the formula's fast mode; layers / tp when the plan carries no step model."""
    from hetcompile.perf.capacity import fluid_capacity

    sm = replica.replica_model()
    ws = [w for w in plan.workloads if w.model == replica.model]
    total = sum(w.demand for w in ws)
    if sm is None or not ws or total <= 0:
        return [stage_work(s) for s in replica.stages]
    i = sum(w.demand * w.input_tokens for w in ws) / total
    o = sum(w.demand * w.output_tokens for w in ws) / total
    return list(fluid_capacity(sm, i, o).stage_times)


def planned_latency(plan: PlanDoc, w: str, key: str) -> float | None:
    """What plan.md states for workload w: its p99 TTFT or TPOT (key: ttft_s or tpot_s) at the
    planned load, by the tail model on the worst routed replica (plan.json's `predicted`). The
    replicas' own estimates are full-load figures for a workload without an SLO, so a mean of them
    is neither what a request sees at the planned load nor comparable with a p99."""
    wl = next((x for x in plan.workloads if x.name == w), None)
    if wl is None or wl.predicted is None:
        return None
    return getattr(wl.predicted, key)


def replica_gpus(replica: PlanReplica) -> int:
    """GPUs a replica runs on: TP per stage, summed over stages."""
    return sum(max(s.tp, 1) for s in replica.stages)


def node_index(plan: PlanDoc) -> dict[str, PlanNode]:
    return {n.id: n for n in plan.nodes}


def stage_offer(nodes: dict[str, PlanNode], stage: PlanStage) -> str | None:
    """The offer of a stage's node, None for a node the plan lacks."""
    return nodes[stage.node].offer if stage.node in nodes else None


def replica_offers(plan: PlanDoc, replica: PlanReplica) -> tuple[str, ...]:
    """The offers of a replica's stage nodes, in stage order ('?' for a node the plan lacks)."""
    nodes = node_index(plan)
    return tuple(stage_offer(nodes, s) or "?" for s in replica.stages)


def replica_price(plan: PlanDoc, replica: PlanReplica) -> float:
    """$/h of a replica (plan.json carries it per replica: the sum of its nodes' prices)."""
    return replica.price_per_hour
