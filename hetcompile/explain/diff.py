"""Two plan documents -> `PlanDiff`: offers, nodes, replicas, routing, totals, and a migration plan.

Matching replicas. A replica is deployed as one SkyPilot cluster (`<plan>-<replica>`) of
`num_nodes` = depth nodes from one offer; node ids (`<region>-<gpu>-<k>`) are labels that place
hands out in order, not machines. So two replicas are the same deployment when their
*deployment key* agrees:

    D(r) = (model, dtype, ((offer, gpu, region, tp, [start, end)) for each stage, in order))

and the rule, applied in this order to replicas not yet matched (ids in natural order), is:

1. untouched        D equal, the same engine args and node ids        (nothing to do)
2. untouched        D equal, the same engine args, other node or replica ids: `relabelled`
                    (the running cluster keeps serving; only names in the new plan differ)
3. changed          same model and same GPU type(s), anything else differs: engine args
                    (`PlanReplica.engine_args`, the vLLM flags every node runs with: a larger
                    max_model_len, another step budget), layers moved, TP, depth, region or
                    offer changed. Pairs are picked greedily, most alike first (same offers,
                    regions, TP, depth, layers). `in_place` when offers, depth and TP agree:
                    the migration restarts it on its own cluster with the new engine args
                    (migrate/planner.py), one replica at a time, instead of provisioning a new one.
4. added / removed  the rest.

A plan.json written before engine_args existed has none; its replicas compare on D alone.

Every other section compares values after `canon()` (6 significant digits), so a plan diffed
with itself, or with a rebuild of the same spec, is empty.
"""

from __future__ import annotations

from collections import defaultdict

from hetcompile.plan.canon import canon, natural_key
from hetcompile.explain import rates
from hetcompile.plan.doc import PlanDoc, PlanReplica
from hetcompile.explain.model import (
    FieldChange, MetricDelta, Migration, NodeRef, OfferDelta, PlanDiff, PlanRef, ReplicaPair, ReplicaRef, WeightShift, WorkloadDelta,
)

METRICS = ("requests_per_s", "tokens_per_s", "output_tokens_per_s", "price_per_hour", "budget_per_hour", "gpus",
           "objective_value", "bound", "gap", "makespan_s", "scale", "tokens_per_dollar")


def stage_keys(plan: PlanDoc, r: PlanReplica) -> tuple:
    nodes = rates.node_index(plan)
    return tuple((rates.stage_offer(nodes, s), s.gpu, s.region, s.tp, s.layers) for s in r.stages)


def deploy_key(plan: PlanDoc, r: PlanReplica) -> tuple:
    """D(r) of the module docstring."""
    return (r.model, r.dtype, stage_keys(plan, r))


def same_engine(o: PlanReplica, n: PlanReplica) -> bool:
    """Whether the engine args agree; a plan.json that predates them (none) matches anything."""
    return not o.engine_args or not n.engine_args or o.engine_args == n.engine_args


def _flags(r: PlanReplica) -> dict[str, str]:
    """'--flag value' entries as {flag: value} ('' for a flag without one)."""
    return dict((x.split(" ", 1) + [""])[:2] for x in r.engine_args)


def engine_change(o: PlanReplica, n: PlanReplica) -> tuple[str, str] | None:
    """(old, new) text of the engine flags that differ ('--max-model-len 4096' -> '--max-model-len 8192'),
    flags one side lacks shown as '-'; None when the engines agree."""
    if same_engine(o, n):
        return None
    a, b = _flags(o), _flags(n)
    keys = [k for k in dict.fromkeys([*a, *b]) if a.get(k) != b.get(k)]

    def side(f: dict[str, str]) -> str:
        return "; ".join(f"{k} {f[k]}".strip() if k in f else f"{k} -" for k in keys)

    return side(a), side(b)


def node_ids(r: PlanReplica) -> tuple:
    return tuple(s.node for s in r.stages)


def gpu_types(r: PlanReplica) -> frozenset:
    return frozenset(s.gpu for s in r.stages)


def _partition(r: PlanReplica) -> str:
    return ",".join(str(s.layers[1] - s.layers[0]) for s in r.stages)


def changes(old: PlanDoc, o: PlanReplica, new: PlanDoc, n: PlanReplica) -> tuple[FieldChange, ...]:
    """What differs between old replica `o` and new replica `n` (as text, for people and tools)."""
    def stages(plan: PlanDoc, r: PlanReplica, i: int) -> str:
        vals = [str(k[i]) for k in stage_keys(plan, r)]
        return vals[0] if len(set(vals)) == 1 else ",".join(vals)  # one value when every stage agrees

    rows = [
        ("offer", stages(old, o, 0), stages(new, n, 0)),
        ("gpu", stages(old, o, 1), stages(new, n, 1)),
        ("region", stages(old, o, 2), stages(new, n, 2)),
        ("tp", stages(old, o, 3), stages(new, n, 3)),
        ("pp", str(len(o.stages)), str(len(n.stages))),
        ("layers", _partition(o), _partition(n)),
        ("dtype", o.dtype, n.dtype),
        ("nodes", ",".join(node_ids(o)), ",".join(node_ids(n))),
        ("estimate", o.estimate_source, n.estimate_source),
    ]
    eng = engine_change(o, n)
    if eng is not None:
        rows.append(("engine", *eng))
    return tuple(FieldChange(field=f, old=a, new=b) for f, a, b in rows if a != b)


def _similarity(old: PlanDoc, o: PlanReplica, new: PlanDoc, n: PlanReplica) -> tuple:
    a, b = stage_keys(old, o), stage_keys(new, n)
    return (
        [k[0] for k in a] == [k[0] for k in b], {k[2] for k in a} == {k[2] for k in b},
        [k[3] for k in a] == [k[3] for k in b], len(a) == len(b), [k[4] for k in a] == [k[4] for k in b],
    )


Pair = tuple[PlanReplica, PlanReplica]


def match(old: PlanDoc, new: PlanDoc) -> tuple[list[tuple[PlanReplica, PlanReplica, bool]], list[Pair], list[PlanReplica],
                                               list[PlanReplica]]:
    """(untouched (o, n, relabelled), changed (o, n), added, removed) by the module docstring's rule."""
    olds = sorted(old.replicas, key=lambda r: natural_key(r.id))
    news = sorted(new.replicas, key=lambda r: natural_key(r.id))
    used_o: set[str] = set()
    used_n: set[str] = set()
    untouched: list[tuple[PlanReplica, PlanReplica, bool]] = []

    def pair_by(key, relabel: bool) -> None:
        free: dict[tuple, list[PlanReplica]] = defaultdict(list)
        for n in news:
            if n.id not in used_n:
                free[key(new, n)].append(n)
        for o in olds:
            match = next((n for n in free.get(key(old, o), ()) if same_engine(o, n)), None) if o.id not in used_o else None
            if match is None:
                continue
            free[key(old, o)].remove(match)
            used_o.add(o.id)
            used_n.add(match.id)
            untouched.append((o, match, relabel or o.id != match.id))

    pair_by(lambda p, r: (deploy_key(p, r), node_ids(r)), False)
    pair_by(deploy_key, True)

    cands = []
    for o in olds:
        for n in news:
            if o.id not in used_o and n.id not in used_n and o.model == n.model and gpu_types(o) == gpu_types(n):
                cands.append((tuple(not x for x in _similarity(old, o, new, n)), natural_key(o.id), natural_key(n.id), o, n))
    changed = []
    for *_, o, n in sorted(cands, key=lambda c: c[:3]):
        if o.id not in used_o and n.id not in used_n:
            used_o.add(o.id)
            used_n.add(n.id)
            changed.append((o, n))
    added = [n for n in news if n.id not in used_n]
    removed = [o for o in olds if o.id not in used_o]
    untouched.sort(key=lambda p: natural_key(p[0].id))
    changed.sort(key=lambda p: natural_key(p[0].id))
    return untouched, changed, added, removed


def _ref(plan: PlanDoc, r: PlanReplica) -> ReplicaRef:
    return ReplicaRef(id=r.id, model=r.model, shape=r.shape, regions=tuple(dict.fromkeys(s.region for s in r.stages)),
                      gpus=rates.replica_gpus(r), price_per_hour=rates.replica_price(plan, r))


def in_place(old: PlanDoc, o: PlanReplica, new: PlanDoc, n: PlanReplica) -> bool:
    """Whether `n` can run on `o`'s cluster: the same offer for every stage (so the same depth and
    machines) and the same TP, the model unchanged; what differs is engine args or layer split."""
    a, b = stage_keys(old, o), stage_keys(new, n)
    return o.model == n.model and [k[0] for k in a] == [k[0] for k in b] and [k[3] for k in a] == [k[3] for k in b]


def _pair(old: PlanDoc, o: PlanReplica, new: PlanDoc, n: PlanReplica, relabelled: bool, with_changes: bool) -> ReplicaPair:
    return ReplicaPair(
        old=o.id, new=n.id, relabelled=relabelled, changes=changes(old, o, new, n) if with_changes else (),
        in_place=in_place(old, o, new, n),
        delta_price_per_hour=rates.replica_price(new, n) - rates.replica_price(old, o),
    )


def _same(a: object, b: object) -> bool:
    return canon(a) == canon(b)


def offer_deltas(old: PlanDoc, new: PlanDoc) -> tuple[OfferDelta, ...]:
    def tally(plan: PlanDoc) -> dict[str, tuple[int, int, float]]:
        out: dict[str, list] = defaultdict(lambda: [0, 0, 0.0])
        for n in plan.nodes:
            t = out[n.offer]
            t[0] += 1
            t[1] += n.gpus
            t[2] += n.price_per_hour
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


def node_changes(old: PlanDoc, new: PlanDoc) -> tuple[tuple[NodeRef, ...], tuple[NodeRef, ...]]:
    def refs(plan: PlanDoc) -> dict[tuple, NodeRef]:
        return {(n.id, n.offer): NodeRef(id=n.id, offer=n.offer, price_per_hour=n.price_per_hour) for n in plan.nodes}

    a, b = refs(old), refs(new)
    order = lambda k: (natural_key(k[0]), str(k[1]))  # noqa: E731
    return tuple(b[k] for k in sorted(set(b) - set(a), key=order)), tuple(a[k] for k in sorted(set(a) - set(b), key=order))


def weight_shifts(old: PlanDoc, new: PlanDoc, pairs: list[Pair], added: list[PlanReplica],
                  removed: list[PlanReplica]) -> tuple[WeightShift, ...]:
    rows = []
    for w in sorted(set(old.routing) | set(new.routing)):
        cases = [(o.id, n.id) for o, n in pairs] + [(None, n.id) for n in added] + [(o.id, None) for o in removed]
        for oid, nid in cases:
            a = rates.weight(old, w, oid) if oid else 0.0
            b = rates.weight(new, w, nid) if nid else 0.0
            if not _same(a, b):
                rows.append(WeightShift(workload=w, old=oid, new=nid, old_weight=a, new_weight=b, delta=b - a))
    return tuple(sorted(rows, key=lambda s: (s.workload, natural_key(s.old or "~"), natural_key(s.new or "~"))))


def metric_deltas(old: PlanDoc, new: PlanDoc) -> tuple[MetricDelta, ...]:
    """The numeric totals that move (METRICS: every numeric field of `Totals`)."""
    rows = []
    for k in METRICS:
        x, y = getattr(old.totals, k), getattr(new.totals, k)
        if (x is None and y is None) or _same(x, y):
            continue
        delta = y - x if isinstance(x, (int, float)) and isinstance(y, (int, float)) else None
        rows.append(MetricDelta(metric=k, old=x, new=y, delta=delta))
    return tuple(rows)


def workload_deltas(old: PlanDoc, new: PlanDoc) -> tuple[WorkloadDelta, ...]:
    sa, sb = rates.served(old), rates.served(new)
    ka, kb = rates.plan_capacity(old), rates.plan_capacity(new)
    rows = []
    for w in sorted(set(sa) | set(sb)):
        vals = dict(
            old_served=sa.get(w), new_served=sb.get(w), old_capacity=ka.get(w), new_capacity=kb.get(w),
            old_ttft_s=rates.planned_latency(old, w, "ttft_s") if w in sa else None,
            new_ttft_s=rates.planned_latency(new, w, "ttft_s") if w in sb else None,
            old_tpot_s=rates.planned_latency(old, w, "tpot_s") if w in sa else None,
            new_tpot_s=rates.planned_latency(new, w, "tpot_s") if w in sb else None,
        )
        if any(not _same(vals[f"old_{k}"], vals[f"new_{k}"]) for k in ("served", "capacity", "ttft_s", "tpot_s")):
            rows.append(WorkloadDelta(workload=w, **vals))
    return tuple(rows)


def _models(plan: PlanDoc) -> tuple[str, ...]:
    return tuple(sorted({m.name for m in plan.models} | {r.model for r in plan.replicas}))


# match()'s result: (untouched (o, n, relabelled), changed (o, n), added, removed)
Matching = tuple[list[tuple[PlanReplica, PlanReplica, bool]], list[Pair], list[PlanReplica], list[PlanReplica]]


def diff_plans(old: PlanDoc, new: PlanDoc, matching: Matching, migration: Migration) -> PlanDiff:
    """What changes from `old` (running now) to `new` (to roll out) by `matching` (match(old, new)),
    with `migration`, the steps to get there that the migration planner ordered from the same
    matching (hetcompile.migrate.planner.plan_diff puts the two together: explain depends on no
    planner, migrate on explain's matching and models, one direction)."""
    untouched, changed, added, removed = matching
    pairs = [(o, n) for o, n, _ in untouched] + changed
    notes = []
    if _models(old) != _models(new):
        notes.append(f"the plans serve different models (old: {', '.join(_models(old))}; new: {', '.join(_models(new))}); "
                     "replicas of a model in one plan only are added or removed")
    if old.plan != new.plan:
        notes.append(f"plan names differ ({old.plan} -> {new.plan}): SkyPilot clusters are named "
                     "<plan>-<replica>, so untouched replicas keep their old cluster names")
    if old.spec_hash != new.spec_hash:
        notes.append("built from different specs")
    n_add, n_rem = node_changes(old, new)
    bo = [b.text for b in old.totals.binding]
    bn = [b.text for b in new.totals.binding]
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
    return PlanDiff(
        old=PlanRef(plan=old.plan, spec_hash=old.spec_hash, models=_models(old)),
        new=PlanRef(plan=new.plan, spec_hash=new.spec_hash, models=_models(new)),
        empty=empty, notes=tuple(notes), migration=migration, **body,
    )
