"""Two plan dicts -> `PlanDiff`: offers, nodes, replicas, routing, totals, and a migration plan.

Matching replicas. A replica is deployed as one SkyPilot cluster (`<plan>-<replica>`) of
`num_nodes` = depth nodes from one offer; node ids (`<region>-<gpu>-<k>`) are labels that place
hands out in order, not machines. So two replicas are the same deployment when their
*deployment key* agrees:

    D(r) = (model, dtype, ((offer, gpu, region, tp, [start, end)) for each stage, in order))

and the rule, applied in this order to replicas not yet matched (ids in natural order), is:

1. untouched        D equal and the same node ids                     (nothing to do)
2. untouched        D equal, other node or replica ids: `relabelled`  (the running cluster
                    keeps serving; only names in the new plan differ)
3. changed          same model and same GPU type(s), anything else differs: layers moved, TP,
                    depth, region or offer changed. Pairs are picked greedily, most alike first
                    (same offers, regions, TP, depth, layers). `in_place` when offers, depth and TP
                    agree (a restart with new engine args would do); the migration still
                    replaces it, which keeps its capacity up.
4. added / removed  the rest.

Every other section compares values after `canon()` (6 significant digits), so a plan diffed
with itself, or with a rebuild of the same spec, is empty.
"""

from __future__ import annotations

from collections import defaultdict

from hetcompile.plan.canon import canon, natural_key
from hetcompile.explain import rates
from hetcompile.migrate.planner import plan_migration
from hetcompile.explain.model import (
    FieldChange, MetricDelta, NodeRef, OfferDelta, PlanDiff, PlanRef, ReplicaPair, ReplicaRef, WeightShift, WorkloadDelta,
)

METRICS = ("requests_per_s", "tokens_per_s", "output_tokens_per_s", "price_per_hour", "budget_per_hour", "gpus",
           "objective_value", "bound", "gap", "makespan_s", "scale", "tokens_per_dollar")


def stage_keys(plan: dict, r: dict) -> tuple:
    nodes = rates.node_index(plan)
    return tuple(
        (nodes.get(s.get("node"), {}).get("offer"), s.get("gpu"), s.get("region"), s.get("tp"), tuple(s.get("layers", ())))
        for s in r.get("stages", [])
    )


def deploy_key(plan: dict, r: dict) -> tuple:
    """D(r) of the module docstring."""
    return (r["model"], r.get("dtype"), stage_keys(plan, r))


def node_ids(r: dict) -> tuple:
    return tuple(s.get("node") for s in r.get("stages", []))


def gpu_types(r: dict) -> frozenset:
    return frozenset(s.get("gpu") for s in r.get("stages", []))


def _partition(r: dict) -> str:
    return ",".join(str(s["layers"][1] - s["layers"][0]) for s in r.get("stages", []))


def changes(old: dict, o: dict, new: dict, n: dict) -> tuple[FieldChange, ...]:
    """What differs between old replica `o` and new replica `n` (as text, for people and tools)."""
    def stages(plan: dict, r: dict, i: int) -> str:
        vals = [str(k[i]) for k in stage_keys(plan, r)]
        return vals[0] if len(set(vals)) == 1 else ",".join(vals)  # one value when every stage agrees

    rows = [
        ("offer", stages(old, o, 0), stages(new, n, 0)),
        ("gpu", stages(old, o, 1), stages(new, n, 1)),
        ("region", stages(old, o, 2), stages(new, n, 2)),
        ("tp", stages(old, o, 3), stages(new, n, 3)),
        ("pp", str(len(o.get("stages", []))), str(len(n.get("stages", [])))),
        ("layers", _partition(o), _partition(n)),
        ("dtype", str(o.get("dtype")), str(n.get("dtype"))),
        ("nodes", ",".join(map(str, node_ids(o))), ",".join(map(str, node_ids(n)))),
        ("estimate", str(o.get("estimate_source")), str(n.get("estimate_source"))),
    ]
    return tuple(FieldChange(field=f, old=a, new=b) for f, a, b in rows if a != b)


def _similarity(old: dict, o: dict, new: dict, n: dict) -> tuple:
    a, b = stage_keys(old, o), stage_keys(new, n)
    return (
        [k[0] for k in a] == [k[0] for k in b], {k[2] for k in a} == {k[2] for k in b},
        [k[3] for k in a] == [k[3] for k in b], len(a) == len(b), [k[4] for k in a] == [k[4] for k in b],
    )


def match(old: dict, new: dict) -> tuple[list[tuple[dict, dict, bool]], list[tuple[dict, dict]], list[dict], list[dict]]:
    """(untouched (o, n, relabelled), changed (o, n), added, removed) by the module docstring's rule."""
    olds = sorted(old["replicas"], key=lambda r: natural_key(r["id"]))
    news = sorted(new["replicas"], key=lambda r: natural_key(r["id"]))
    used_o: set[str] = set()
    used_n: set[str] = set()
    untouched: list[tuple[dict, dict, bool]] = []

    def pair_by(key, relabel: bool) -> None:
        free: dict[tuple, list[dict]] = defaultdict(list)
        for n in news:
            if n["id"] not in used_n:
                free[key(new, n)].append(n)
        for o in olds:
            if o["id"] in used_o or not free.get(key(old, o)):
                continue
            n = free[key(old, o)].pop(0)
            used_o.add(o["id"])
            used_n.add(n["id"])
            untouched.append((o, n, relabel or o["id"] != n["id"]))

    pair_by(lambda p, r: (deploy_key(p, r), node_ids(r)), False)
    pair_by(deploy_key, True)

    cands = []
    for o in olds:
        for n in news:
            if o["id"] not in used_o and n["id"] not in used_n and o["model"] == n["model"] and gpu_types(o) == gpu_types(n):
                cands.append((tuple(not x for x in _similarity(old, o, new, n)), natural_key(o["id"]), natural_key(n["id"]), o, n))
    changed = []
    for *_, o, n in sorted(cands, key=lambda c: c[:3]):
        if o["id"] not in used_o and n["id"] not in used_n:
            used_o.add(o["id"])
            used_n.add(n["id"])
            changed.append((o, n))
    added = [n for n in news if n["id"] not in used_n]
    removed = [o for o in olds if o["id"] not in used_o]
    untouched.sort(key=lambda p: natural_key(p[0]["id"]))
    changed.sort(key=lambda p: natural_key(p[0]["id"]))
    return untouched, changed, added, removed


def _ref(plan: dict, r: dict) -> ReplicaRef:
    return ReplicaRef(id=r["id"], model=r["model"], shape=r.get("shape"),
                      regions=tuple(dict.fromkeys(s.get("region") for s in r.get("stages", []))),
                      gpus=rates.replica_gpus(r), price_per_hour=rates.replica_price(plan, r))


def _pair(old: dict, o: dict, new: dict, n: dict, relabelled: bool, with_changes: bool) -> ReplicaPair:
    a, b = stage_keys(old, o), stage_keys(new, n)
    return ReplicaPair(
        old=o["id"], new=n["id"], relabelled=relabelled, changes=changes(old, o, new, n) if with_changes else (),
        in_place=[k[0] for k in a] == [k[0] for k in b] and [k[3] for k in a] == [k[3] for k in b],
        delta_price_per_hour=rates.replica_price(new, n) - rates.replica_price(old, o),
    )


def _same(a: object, b: object) -> bool:
    return canon(a) == canon(b)


def offer_deltas(old: dict, new: dict) -> tuple[OfferDelta, ...]:
    def tally(plan: dict) -> dict[str, tuple[int, int, float]]:
        out: dict[str, list] = defaultdict(lambda: [0, 0, 0.0])
        for n in plan["nodes"]:
            t = out[n.get("offer", "?")]
            t[0] += 1
            t[1] += int(n.get("gpus") or 0)
            t[2] += float(n.get("price_per_hour") or 0.0)
        return {k: tuple(v) for k, v in out.items()}

    a, b = tally(old), tally(new)
    rows = []
    for o in sorted(set(a) | set(b)):
        x, y = a.get(o, (0, 0, 0.0)), b.get(o, (0, 0, 0.0))
        if x[:2] == y[:2] and _same(x[2], y[2]):
            continue
        status = "added" if o not in a else "removed" if o not in b else "changed"
        rows.append(OfferDelta(offer=o, status=status, old_nodes=x[0], new_nodes=y[0], old_gpus=x[1], new_gpus=y[1],
                               delta_price_per_hour=y[2] - x[2]))
    return tuple(rows)


def node_changes(old: dict, new: dict) -> tuple[tuple[NodeRef, ...], tuple[NodeRef, ...]]:
    def refs(plan: dict) -> dict[tuple, NodeRef]:
        return {(n["id"], n.get("offer")): NodeRef(id=n["id"], offer=n.get("offer"), price_per_hour=float(n.get("price_per_hour") or 0.0))
                for n in plan["nodes"]}

    a, b = refs(old), refs(new)
    order = lambda k: (natural_key(k[0]), str(k[1]))  # noqa: E731
    return tuple(b[k] for k in sorted(set(b) - set(a), key=order)), tuple(a[k] for k in sorted(set(a) - set(b), key=order))


def weight_shifts(old: dict, new: dict, pairs: list[tuple[dict, dict]], added: list[dict], removed: list[dict]) -> tuple[WeightShift, ...]:
    rows = []
    for w in sorted(set(old.get("routing") or {}) | set(new.get("routing") or {})):
        cases = [(o["id"], n["id"]) for o, n in pairs] + [(None, n["id"]) for n in added] + [(o["id"], None) for o in removed]
        for oid, nid in cases:
            a = rates.weight(old, w, oid) if oid else 0.0
            b = rates.weight(new, w, nid) if nid else 0.0
            if not _same(a, b):
                rows.append(WeightShift(workload=w, old=oid, new=nid, old_weight=a, new_weight=b, delta=b - a))
    return tuple(sorted(rows, key=lambda s: (s.workload, natural_key(s.old or "~"), natural_key(s.new or "~"))))


def metric_deltas(old: dict, new: dict) -> tuple[MetricDelta, ...]:
    a, b = old.get("totals", {}), new.get("totals", {})
    extra = sorted(k for k in set(a) | set(b) if k not in METRICS and isinstance(a.get(k, b.get(k)), (int, float))
                   and not isinstance(a.get(k, b.get(k)), bool))
    rows = []
    for k in METRICS + tuple(extra):
        x, y = a.get(k), b.get(k)
        if (x is None and y is None) or _same(x, y):
            continue
        delta = y - x if isinstance(x, (int, float)) and isinstance(y, (int, float)) else None
        rows.append(MetricDelta(metric=k, old=x, new=y, delta=delta))
    return tuple(rows)


def workload_deltas(old: dict, new: dict) -> tuple[WorkloadDelta, ...]:
    sa, sb = rates.served(old), rates.served(new)
    ka, kb = rates.plan_capacity(old), rates.plan_capacity(new)
    rows = []
    for w in sorted(set(sa) | set(sb)):
        vals = dict(
            old_served=sa.get(w), new_served=sb.get(w), old_capacity=ka.get(w), new_capacity=kb.get(w),
            old_ttft_s=rates.mean_latency(old, w, "ttft_s") if w in sa else None,
            new_ttft_s=rates.mean_latency(new, w, "ttft_s") if w in sb else None,
            old_tpot_s=rates.mean_latency(old, w, "tpot_s") if w in sa else None,
            new_tpot_s=rates.mean_latency(new, w, "tpot_s") if w in sb else None,
        )
        if any(not _same(vals[f"old_{k}"], vals[f"new_{k}"]) for k in ("served", "capacity", "ttft_s", "tpot_s")):
            rows.append(WorkloadDelta(workload=w, **vals))
    return tuple(rows)


def _models(plan: dict) -> tuple[str, ...]:
    return tuple(sorted({m.get("name") for m in plan.get("models", [])} | {r["model"] for r in plan["replicas"]}))


def diff_plans(old: dict, new: dict) -> PlanDiff:
    """What changes from `old` (running now) to `new` (to roll out), and the steps to get there."""
    untouched, changed, added, removed = match(old, new)
    pairs = [(o, n) for o, n, _ in untouched] + changed
    notes = []
    if _models(old) != _models(new):
        notes.append(f"the plans serve different models (old: {', '.join(_models(old))}; new: {', '.join(_models(new))}); "
                     "replicas of a model in one plan only are added or removed")
    if old.get("plan") != new.get("plan"):
        notes.append(f"plan names differ ({old.get('plan')} -> {new.get('plan')}): SkyPilot clusters are named "
                     "<plan>-<replica>, so untouched replicas keep their old cluster names")
    if old.get("spec_hash") != new.get("spec_hash"):
        notes.append("built from different specs")
    n_add, n_rem = node_changes(old, new)
    bo = [b["text"] for b in old.get("totals", {}).get("binding", [])]
    bn = [b["text"] for b in new.get("totals", {}).get("binding", [])]
    unt = tuple(_pair(old, o, new, n, rl, False) for o, n, rl in untouched)
    chg = tuple(_pair(old, o, new, n, False, True) for o, n in changed)
    body = dict(
        offers=offer_deltas(old, new), nodes_added=n_add, nodes_removed=n_rem, untouched=unt, changed=chg,
        added=tuple(_ref(new, n) for n in added), removed=tuple(_ref(old, o) for o in removed),
        routing=weight_shifts(old, new, pairs, added, removed), totals=metric_deltas(old, new),
        workloads=workload_deltas(old, new),
        binding_added=tuple(b for b in bn if b not in bo), binding_removed=tuple(b for b in bo if b not in bn),
    )
    empty = not any(v for k, v in body.items() if k != "untouched") and not any(p.relabelled for p in unt)
    migration = plan_migration(old, new, untouched, changed, added, removed)
    return PlanDiff(
        old=PlanRef(plan=str(old.get("plan")), spec_hash=old.get("spec_hash"), models=_models(old)),
        new=PlanRef(plan=str(new.get("plan")), spec_hash=new.get("spec_hash"), models=_models(new)),
        empty=empty, notes=tuple(notes), migration=migration, **body,
    )
