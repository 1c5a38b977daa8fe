"""route: routing weights per workload class and replica, and the router's class rules.

Weights come from compose's r_{c,w}: each of the y_c copies of shape c takes r_{c,w} / y_c of
workload w, normalized over the replicas that serve w (seed 003's x_{c,w}; Helix §5.1 routes by
the same kind of flow-proportional weights with IWRR). Class rules, when the spec gives no
`match:`, split a model's workloads by their means: sorted by (input, output) tokens, each class
but the last matches prompts shorter than the geometric mean of its and the next class's input
(or, when inputs tie, max_tokens below the geometric mean of the outputs); the last class
matches everything else.
"""

from __future__ import annotations

import math

from hetcompile.ir.problem import Problem
from hetcompile.ir.routing import (
    VLLM_KEY_ENV,
    ClassMatch,
    ReplicaWeight,
    RoutedModel,
    RoutedReplica,
    RoutingTable,
    WorkloadClass,
)
from hetcompile.passes.base import Pass, PassContext

WEIGHT_DIGITS = 6


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


def routing_table(ir: Problem) -> RoutingTable:
    counts = dict(ir.composition.counts)
    per_replica: dict[tuple[str, str], float] = {}
    for shape, w, rate in ir.composition.rates:
        for r in ir.replicas:
            if r.shape == shape:
                per_replica[(r.id, w)] = rate / counts[shape]
    models = []
    for m in ir.models:
        ws = [w for w in ir.workloads if w.model == m.name]
        rules = class_rules(ws)
        order = sorted(ws, key=lambda w: (w.input_tokens, w.output_tokens, w.name))
        # explicit matches first (they are specific), derived ones after in size order
        order = [w for w in order if w.match] + [w for w in order if not w.match]
        classes = []
        for w in order:
            shares = {rid: v for (rid, wn), v in per_replica.items() if wn == w.name and v > 0}
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
    for r in ir.replicas:
        est = r.estimate
        replicas.append(
            RoutedReplica(
                id=r.id, model=ir.model(r.model).served_name, endpoint=None, kv_capacity_tokens=max(1, est.kv_capacity_tokens),
                max_num_seqs=ir.engine.max_num_seqs, prefill_tokens_per_s=round(est.prefill_tokens_per_s, 3),
                decode_tokens_per_s=round(est.decode_tokens_per_s, 3),
                gpu="+".join(sorted({s.gpu for s in r.stages})), region="+".join(sorted({s.region for s in r.stages})),
                api_key_env=VLLM_KEY_ENV,
            )
        )
    return RoutingTable(
        plan=ir.name, spec_hash=ir.spec_hash, policy="weighted", models=tuple(sorted(models, key=lambda m: m.name)),
        replicas=tuple(replicas),
    )


class Route(Pass):
    name = "route"
    requires = ("replicas", "composition")
    provides = "routing"

    def run(self, ir: Problem, ctx: PassContext) -> Problem:
        return ir.model_copy(update={"routing": routing_table(ir)})
