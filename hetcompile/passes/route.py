"""route: routing weights per workload class and replica, and the router's class rules.

Weights come from compose's r_{c,w}: each of the y_c copies of shape c takes r_{c,w} / y_c of
workload w, normalized over the replicas that serve w (seed 003's x_{c,w}; Helix §5.1 routes by
the same kind of flow-proportional weights with IWRR). Class rules, when the spec gives no
`match:`, split a model's workloads by their means: sorted by (input, output) tokens, each class
but the last matches prompts shorter than the geometric mean of its and the next class's input
(or, when inputs tie, max_tokens below the geometric mean of the outputs); the last class
matches everything else.

Admission limits (issue 18, the router protects the promise): each replica gets C, the
requests its capacity estimate runs at once, and a queue Q that drains within the TTFT budget:
by Little's law Q requests ahead of a newcomer leave in Q / h seconds at the capacity h, so
Q = floor(h x budget). The budget is the workload's TTFT SLO, or without one
DEFAULT_TTFT_FACTOR x the predicted TTFT at capacity, at least DEFAULT_TTFT_FLOOR_S. A replica
serving several workloads takes the rate-weighted mean of their C, h and Q (its planned mix).
The first-byte timeout is FIRST_BYTE_FACTOR x the longest wait an admitted request should see
(budget + predicted TTFT), clamped to [FIRST_BYTE_MIN_S, FIRST_BYTE_MAX_S]: far enough above
the promise that a loaded but working replica never trips it, soon enough that a hung one is
left before clients give up.

Paper: Jiang et al., "Demystifying Cost-Efficiency in LLM Serving over Heterogeneous GPUs" (seed 003), §4.3 (x_(c,w): each configuration's share of a workload); Mei et al., "Helix: Serving Large Language Models over Heterogeneous GPUs and Network via Max-Flow" (ASPLOS 2025; seed 000), §5.1-5.2 (weighted
routing over the flow); Xiong et al., "High-Throughput LLM inference on Heterogeneous Clusters" (Huawei; seed 004), §4 eq. 5-8 and Alg. 2 (the router's min-max policy).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from hetcompile.ir.problem import Problem
from hetcompile.plan.routing import (
    VLLM_KEY_ENV,
    ClassMatch,
    DisaggregatedGroup,
    ReplicaWeight,
    RoutedModel,
    RoutedReplica,
    RoutingTable,
    WorkloadClass,
)
from hetcompile.passes.base import Pass, PassContext

WEIGHT_DIGITS = 6
DEFAULT_TTFT_FACTOR = 4.0
DEFAULT_TTFT_FLOOR_S = 1.0
FIRST_BYTE_FACTOR = 4.0
FIRST_BYTE_MIN_S = 5.0
FIRST_BYTE_MAX_S = 60.0


def class_rules(workloads: list) -> dict[str, ClassMatch]:
    ws = sorted(workloads, key=lambda w: (w.input_tokens, w.output_tokens, w.name))
    rules: dict[str, ClassMatch] = {}
    for i, w in enumerate(ws):
        if w.match:
            rules[w.name] = ClassMatch(**w.match)
        elif i == len(ws) - 1:
            rules[w.name] = ClassMatch()
        else:
            nxt = ws[i + 1]
            if nxt.input_tokens > w.input_tokens:
                rules[w.name] = ClassMatch(prompt_tokens_max=max(1, round(math.sqrt(w.input_tokens * nxt.input_tokens))))
            else:
                rules[w.name] = ClassMatch(max_tokens_max=max(1, round(math.sqrt(w.output_tokens * nxt.output_tokens))))
    return rules


def ttft_budget(w, predicted_ttft: float) -> float:
    """Seconds a request of workload `w` may wait for its first token: its SLO, else a default."""
    if w.ttft_slo is not None:
        return w.ttft_slo
    return max(DEFAULT_TTFT_FLOOR_S, DEFAULT_TTFT_FACTOR * predicted_ttft)


def admission(replica, workloads: dict, rates: dict[str, float]) -> dict:
    """Planned concurrency C, queue Q, capacity h and first-byte timeout of one replica.

    `rates` is the replica's planned req/s per workload; only the workloads it serves count,
    and without any (a replica the plan gives no traffic) every one it could serve, equally.
    """
    est = replica.estimate
    conc, cap, ttft = dict(est.concurrency), dict(est.throughput_rps), dict(est.ttft_s)
    names = [w for w in conc if cap.get(w, 0) > 0 and w in workloads]
    if not names:
        return {}
    mix = {w: rates[w] for w in names if rates.get(w, 0.0) > 0}
    if not mix:
        mix = {w: 1.0 for w in names}
    total = sum(mix.values())
    c = q = h = wait = 0.0
    for w, share in mix.items():
        f = share / total
        budget = ttft_budget(workloads[w], ttft.get(w, 0.0))
        c += f * conc[w]
        h += f * cap[w]
        q += f * math.floor(cap[w] * budget)
        wait = max(wait, budget + ttft.get(w, 0.0))
    return {
        "planned_concurrency": max(1, math.floor(c)),
        "max_queue": max(1, math.floor(q)),  # at least one waiting: a replica is never refused while it works
        "capacity_requests_per_s": round(h, 6),
        "first_byte_timeout_s": round(min(FIRST_BYTE_MAX_S, max(FIRST_BYTE_MIN_S, FIRST_BYTE_FACTOR * wait)), 3),
    }


def routing_table(ir: Problem) -> RoutingTable:
    assert ir.composition is not None and ir.replicas is not None  # route requires both
    counts = dict(ir.composition.counts)
    of_shape: dict[str, list[str]] = {}
    for r in ir.replicas:
        of_shape.setdefault(r.shape, []).append(r.id)
    per_replica: dict[tuple[str, str], float] = {}
    for shape, wn, rate in ir.composition.rates:
        for rid in of_shape.get(shape, []):
            per_replica[(rid, wn)] = rate / counts[shape]
    role = {r.id: r.role for r in ir.replicas if r.role is not None}
    groups = _groups(ir, per_replica)
    # per workload and per replica, indexed once: a spec of thousands of workloads scans each once
    by_workload: dict[str, dict[str, float]] = {}
    by_replica: dict[str, dict[str, float]] = {}
    for (rid, wn), v in per_replica.items():
        by_workload.setdefault(wn, {})[rid] = v
        by_replica.setdefault(rid, {})[wn] = v
    group_of: dict[str, list] = {}
    for g in groups.values():
        group_of.setdefault(g.workload, []).append(g)
    models = []
    for m in ir.models:
        ws = [w for w in ir.workloads if w.model == m.name]
        rules = class_rules(ws)
        order = sorted(ws, key=lambda w: (w.input_tokens, w.output_tokens, w.name))
        # explicit matches first (they are specific), derived ones after in size order
        order = [w for w in order if w.match] + [w for w in order if not w.match]
        classes = []
        for w in order:
            # whole requests go to aggregated replicas and to groups (a group's share: what its decode
            # replicas take); a phase replica is reached only through its group
            shares = {rid: v for rid, v in by_workload.get(w.name, {}).items() if v > 0 and rid not in role}
            for g in group_of.get(w.name, []):
                shares[g.id] = sum(v for _, v in g.decode)
            total = sum(shares.values())
            weights = tuple(
                ReplicaWeight(replica=rid, weight=round(v / total, WEIGHT_DIGITS)) for rid, v in sorted(shares.items())
            ) if total > 0 else ()
            classes.append(
                WorkloadClass(
                    name=w.name, match=rules[w.name], input_tokens=w.input_tokens, output_tokens=w.output_tokens, weights=weights
                )
            )
        models.append(RoutedModel(name=m.served_name, classes=tuple(classes)))
    replicas = []
    by_name = {w.name: w for w in ir.workloads}
    for r in ir.replicas:
        est = r.estimate
        rates = by_replica.get(r.id, {})
        replicas.append(
            RoutedReplica(
                id=r.id, model=ir.model(r.model).served_name, endpoint=None, kv_capacity_tokens=max(1, est.kv_capacity_tokens),
                max_num_seqs=r.max_num_seqs or ir.engine.max_num_seqs, prefill_tokens_per_s=round(est.prefill_tokens_per_s, 3),
                decode_tokens_per_s=round(est.decode_tokens_per_s, 3),
                gpu="+".join(sorted({s.gpu for s in r.stages})), region="+".join(sorted({s.region for s in r.stages})),
                api_key_env=VLLM_KEY_ENV, role=r.role, **admission(r, by_name, rates),
            )
        )
    return RoutingTable(
        plan=ir.name, spec_hash=ir.spec_hash, policy="weighted", models=tuple(sorted(models, key=lambda m: m.name)),
        replicas=tuple(replicas),
        groups=tuple(DisaggregatedGroup(id=g.id, model=ir.model(g.model).served_name, prefill=_weights(g.prefill),
                                        decode=_weights(g.decode)) for _, g in sorted(groups.items())),
    )


@dataclass(frozen=True)
class _Group:
    """A disaggregated group with traffic: its replicas' planned req/s of the group's workload."""

    id: str
    workload: str
    model: str
    decode: list[tuple[str, float]] = field(default_factory=list)  # (replica, requests/s)
    prefill: list[tuple[str, float]] = field(default_factory=list)  # (replica, prompts/s)


def _groups(ir: Problem, per_replica: dict[tuple[str, str], float]) -> dict[str, _Group]:
    """Every disaggregated group by id, its members' rates from compose; a group whose prefill or
    decode side gets no traffic is left out."""
    assert ir.replicas is not None
    phase = {r.id: r for r in ir.replicas if r.role is not None and r.group is not None}
    out: dict[str, _Group] = {}
    for (rid, w), v in sorted(per_replica.items()):
        r = phase.get(rid)
        if r is not None and r.group is not None and v > 0:
            g = out.setdefault(r.group, _Group(r.group, w, r.model))
            (g.decode if r.role == "decode" else g.prefill).append((r.id, v))
    return {k: g for k, g in out.items() if g.decode and g.prefill}


def _weights(shares: list[tuple[str, float]]) -> tuple[ReplicaWeight, ...]:
    total = sum(v for _, v in shares)
    return tuple(ReplicaWeight(replica=rid, weight=round(v / total, WEIGHT_DIGITS)) for rid, v in sorted(shares))


class Route(Pass):
    name = "route"
    requires = ("replicas", "composition")
    provides = "routing"

    def run(self, ir: Problem, ctx: PassContext) -> Problem:
        return ir.model_copy(update={"routing": routing_table(ir)})
