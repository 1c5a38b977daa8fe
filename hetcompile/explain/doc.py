"""Explanation / PlanDiff -> a neutral document (sections of lines and tables).

This is the render context: every choice of what to show and how to word it lives here, once;
render.py only lays the same document out as markdown or as rich terminal output.
"""

from __future__ import annotations

from dataclasses import dataclass

from hetcompile.explain.model import Explanation, PlanDiff, Step
from hetcompile.plan.doc import ModelPlacement, PrimaryWorkers
from hetcompile.plan import human


@dataclass(frozen=True)
class Table:
    headers: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]


@dataclass(frozen=True)
class Section:
    title: str
    blocks: tuple[str | Table, ...]  # a str is one line; "- " starts a bullet


@dataclass(frozen=True)
class Doc:
    title: str
    intro: tuple[str, ...]
    sections: tuple[Section, ...]


def num(x: float | None, digits: int = 4) -> str:
    """A number for a person (SI suffix from 10k on, never an exponent): hetcompile/plan/human.py."""
    return human.number(x, digits)


def money(x: float | None) -> str:
    return human.money(x)


def signed_money(x: float | None) -> str:
    """A change in $/h: '+$1.50/h', '-$0.0005/h'; below $0.00005/h it is rounding noise: '±$0.00/h'."""
    if x is None:
        return "-"
    if abs(x) < 5e-5:
        return "±$0.00/h"
    return ("+" if x > 0 else "-") + human.money(abs(x))


def pct(x: float | None) -> str:
    return human.percent(x)


def signed(x: float | None) -> str:
    if x is None:
        return "-"
    return ("+" if x >= 0 else "-") + human.number(abs(x))


def _usd(x: float) -> str:
    """A $/h column cell: cents, or two significant digits below a cent."""
    return human.money(x)[1:-2] if x >= 0 else "-" + human.money(-x)[1:-2]


def _table(headers: tuple[str, ...], rows: list[tuple]) -> Table:
    return Table(headers, tuple(tuple(str(c) for c in r) for r in rows))


# --------------------------------------------------------------------------- explain


def explanation_doc(e: Explanation) -> Doc:
    s = e.summary
    intro = [
        f"Objective **{e.solver.objective}**: {num(s.requests_per_s)} req/s, {num(s.tokens_per_s)} tokens/s for "
        f"{money(s.price_per_hour)}" + (f" of a {money(s.budget_per_hour)} budget" if s.budget_per_hour is not None else "")
        + f"; {human.plural(s.replicas, 'replica')} on {human.plural(s.gpus, 'GPU')}, {human.plural(s.nodes, 'node')}."
        + (f" Makespan {num(s.makespan_s)} s." if s.makespan_s is not None else ""),
        f"Solver: objective {num(e.solver.objective_value, 6)}, bound {num(e.solver.bound, 6)}, gap {pct(e.solver.gap)} — {e.solver.text}.",
    ]
    binds = [f"- {b.text}" + (" *(derived from the chains)*" if b.derived else "") for b in e.binding] or \
        ["- nothing the compose pass reports: the plan is limited by its candidate shapes"]
    replicas = _table(
        ("replica", "model", "GPU", "regions", "TP", "PP", "GPUs", "$/h", "busy", "bottleneck", "estimate"),
        [(r.id, r.model, r.gpu, "+".join(r.regions), r.tp, r.pp, r.gpus, _usd(r.price_per_hour), pct(r.utilisation),
          r.bottleneck.kind + (f" {r.bottleneck.stage}" if r.bottleneck.stage is not None else ""), r.estimate_source)
         for r in e.replicas],
    )
    stages = _table(
        ("replica", "stage", "node", "GPU", "region", "TP", "layers", "work share", "busy", "heaviest"),
        [(r.id, st.index, st.node, st.gpu, st.region, st.tp, f"{st.layers[0]}-{st.layers[1]}", pct(st.work_share),
          pct(st.utilisation), "yes" if st.bottleneck else "")
         for r in e.replicas for st in r.stages],
    )
    loads = _table(
        ("replica", "workload", "weight", "routed req/s", "capacity req/s", "time share", "C", "C limited by", "est. TTFT s", "est. TPOT s"),
        [(r.id, ld.workload, num(ld.weight), num(ld.routed_requests_per_s), num(ld.capacity_requests_per_s),
          pct(ld.time_share), num(ld.concurrency), ld.concurrency_limit, num(ld.ttft_s), num(ld.tpot_s))
         for r in e.replicas for ld in r.workloads],
    )
    chains = [f"- **{r.id}** ({', '.join(ld.workload for ld in r.workloads if ld.time_share > 0) or 'idle'}): "
              f"{r.bottleneck.text}" for r in e.replicas]
    for i, r in enumerate(e.replicas):
        if r.placement:  # the placement pass's own view of the chain, when the plan carries one
            keys = [k for k in ("depth", "concurrency", "concurrency_limit", "concurrency_limit_node", "binding", "binding_node",
                                "helix_flow") if r.placement[k] is not None]
            chains[i] += "; placement: " + ", ".join(f"{k} {_scalar(r.placement[k])}" for k in keys)
    workloads = _table(
        ("workload", "model", "demand", "served req/s", "capacity req/s", "replicas", "p99 TTFT s", "p99 TPOT s"),
        [(w.name, w.model, f"{num(w.demand)} ({w.demand_kind})", num(w.served_requests_per_s), num(w.capacity_requests_per_s),
          ", ".join(w.replicas), num(w.ttft_s), num(w.tpot_s)) for w in e.workloads],
    )
    c = e.cost
    cost_lines: list[str | Table] = [
        f"{money(c.price_per_hour)}" + (f" of {money(c.budget_per_hour)} budget ({money(c.budget_left_per_hour)} left)"
                                         if c.budget_per_hour is not None else " (no budget)")
        + f"; {human.plural(c.rented_gpus, 'rented GPU')}, {c.owned_gpus} owned (free per hour).",
        _table(("offer", "GPU", "region", "cloud", "owned", "nodes", "GPUs", "$/h", "share", "price from"),
               [(o.offer, o.gpu, o.region, o.cloud or "-", "yes" if o.owned else "no", o.nodes, o.gpus,
                 _usd(o.price_per_hour), pct(o.share), o.price_source or "-") for o in c.by_offer]),
        _table(("region", "nodes", "GPUs", "$/h", "share"),
               [(g.region, g.nodes, g.gpus, _usd(g.price_per_hour), pct(g.share)) for g in c.by_region]),
    ]
    if c.idle_nodes:
        cost_lines.append(f"Idle nodes (paid, unused): {', '.join(c.idle_nodes)}.")
    passes = _table(("pass", "status", "objective", "bound", "gap", "notes"),
                    [(p.name, p.status, num(p.objective, 6), num(p.bound, 6), pct(p.gap), "; ".join(p.notes))
                     for p in e.solver.passes])
    estimates = [f"- **{g.source}** ({', '.join(g.replicas)}): {g.text}" for g in e.estimates]
    sections = [
        Section("What binds", tuple(binds)),
        *([Section("What it would take", tuple(e.what_it_would_take[:1]) + tuple(f"- {x}" for x in e.what_it_would_take[1:]))]
          if e.what_it_would_take else []),
        *([Section("Alternatives (compose's budget sweep and runners-up)", tuple(f"- {x}" for x in e.alternatives))]
          if e.alternatives else []),
        *([Section("Prefill/decode disaggregation", tuple(f"- {x}" for x in e.disaggregation))] if e.disaggregation else []),
        Section("Replicas", (replicas,
                             "busy = U_r, the share of the replica's time the plan's served rates use "
                             "(sum over workloads of routed / capacity).")),
        Section("Bottleneck of each chain", tuple(chains)),
        Section("Stages", (stages, "work share = (layers / TP) over the heaviest stage's; a stage's busy time is the "
                                   "replica's times its work share.")),
        Section("Load per replica and workload", (loads, "est. TTFT and TPOT: the replica's estimate, at full load for a "
                                                          "workload without an SLO, at the SLO's percentile and the planned load with one.")),
        Section("Workloads", (workloads, "capacity = every replica at full load with its planned mix of workloads; p99 TTFT "
                                         "and TPOT at the planned load, by the tail model on the worst routed replica (plan.md's).")),
        Section("Cost", tuple(cost_lines)),
        Section("Bound and gap", (e.solver.text + ".", passes)),
        Section("Where the estimates come from", tuple(estimates)),
    ]
    if e.placement:
        sections.append(Section("Placement", tuple(placement_blocks(e.placement))))
    if e.primary_workers:
        sections.append(Section("Primary workers (Hetis §4.1)", tuple(primary_worker_lines(e.primary_workers))))
    if e.notes:
        sections.append(Section("Notes", tuple(f"- {n}" for n in e.notes)))
    return Doc(f"Plan `{e.plan}`", tuple(intro), tuple(sections))


def _scalar(v: object) -> str:
    return num(v, 6) if isinstance(v, float) else str(v)


def primary_worker_lines(block: tuple[PrimaryWorkers, ...]) -> list[str]:
    """Per replica the selection's sentences (plan.json `primary_workers[].text`): GPUs left out, why,
    what became of them, and the attention-worker estimate (analysis only, not deployable)."""
    out = []
    for w in block:
        lines = w.text
        if lines:
            out.append("- " + lines[0] + "".join(f"\n  - {t}" for t in lines[1:]))
    return out


def placement_blocks(block: tuple[ModelPlacement, ...]) -> list[str | Table]:
    """The plan's placement block: per model its scalar fields (set ones, by name), then its chains
    (one row each, scalar fields as columns)."""
    out: list[str | Table] = []
    for m in block:
        fields = m.model_dump(mode="json", exclude={"model", "chains"})
        out.append(f"- **{m.model}**: " + ", ".join(f"{k} {_scalar(v)}" for k, v in sorted(fields.items())
                                                    if not isinstance(v, (list, dict)) and v is not None))
        chains = [c.model_dump(mode="json") for c in m.chains]
        if chains:
            keys = sorted(k for k, v in chains[0].items() if not isinstance(v, (list, dict)))
            out.append(_table(tuple(keys), [tuple(_scalar(c[k]) for k in keys) for c in chains]))
    return out


# --------------------------------------------------------------------------- diff


def _step_row(s: Step, workloads: list[str]) -> tuple:
    cap = {c.workload: c for c in s.capacity}
    marks = []
    for w in workloads:
        c = cap.get(w)
        if c is None:
            marks.append("-")
        else:
            low = c.requests_per_s < c.target * (1 - 1e-6) - 1e-9
            marks.append(f"{num(c.requests_per_s)}{' (dip)' if low else ''}")
    return (s.index, s.action, s.unit.label if s.unit else "", _usd(s.price_per_hour), *marks, s.text)


# plan.json totals keys -> (what a person calls them, how a value is written)
METRIC_NAMES: dict[str, tuple[str, str]] = {
    "requests_per_s": ("throughput (req/s)", "num"),
    "tokens_per_s": ("tokens/s (prompt + output)", "num"),
    "output_tokens_per_s": ("output tokens/s", "num"),
    "price_per_hour": ("cost", "money"),
    "budget_per_hour": ("budget", "money"),
    "gpus": ("GPUs", "num"),
    "objective_value": ("solver objective", "num"),
    "bound": ("solver bound", "num"),
    "gap": ("optimality gap", "pct"),
    "makespan_s": ("makespan (s)", "num"),
    "scale": ("demand served (x the mix)", "num"),
    "tokens_per_dollar": ("tokens per dollar", "num"),
}


def _metric_row(metric: str, old: float | None, new: float | None, delta: float | None) -> tuple:
    """One row of the totals diff with a person's name for the metric (unknown keys: underscores
    become spaces) and values in its own unit."""
    name, kind = METRIC_NAMES.get(metric, (metric.replace("_", " "), "num"))
    if kind == "money":
        return (name, money(old), money(new), signed_money(delta))
    if kind == "pct":
        return (name, pct(old), pct(new), "-" if delta is None else ("+" if delta >= 0 else "-") + pct(abs(delta)))
    return (name, num(old), num(new), signed(delta))


def diff_doc(d: PlanDiff) -> Doc:
    m = d.migration
    price = next((t for t in d.totals if t.metric == "price_per_hour"), None)
    rps = next((t for t in d.totals if t.metric == "requests_per_s"), None)
    intro = [
        f"`{d.old.plan}` (old, running) -> `{d.new.plan}` (new)." + (" **No differences.**" if d.empty else ""),
        f"Replicas: {len(d.untouched)} untouched, {len(d.changed)} changed, {len(d.added)} added, {len(d.removed)} removed; "
        f"$/h {signed_money(price.delta) if price else '±$0.00/h'}; requests/s {signed(rps.delta) if rps else '+0'}.",
    ]
    sections: list[Section] = []
    if d.notes:
        sections.append(Section("Notes", tuple(f"- {n}" for n in d.notes)))
    if d.offers or d.nodes_added or d.nodes_removed:
        blocks: list[str | Table] = []
        if d.offers:
            blocks.append(_table(("offer", "status", "nodes", "GPUs", "$/h delta"),
                                 [(o.offer, o.status, f"{o.old_nodes} -> {o.new_nodes}", f"{o.old_gpus} -> {o.new_gpus}",
                                   signed_money(o.delta_price_per_hour)) for o in d.offers]))
        if d.nodes_added:
            blocks.append("Node ids only in the new plan: " + ", ".join(n.id for n in d.nodes_added) + ".")
        if d.nodes_removed:
            blocks.append("Node ids only in the old plan: " + ", ".join(n.id for n in d.nodes_removed) + ".")
        blocks.append("Node ids are labels place hands out per offer in order; a replica's cluster is what runs.")
        sections.append(Section("Offers and nodes", tuple(blocks)))
    restarted = {s.replaces.old for s in d.migration.steps if s.action == "restart" and s.replaces is not None}
    rows = [("untouched", p.old, p.new, "relabelled" if p.relabelled else "", signed_money(p.delta_price_per_hour)) for p in d.untouched]
    rows += [("changed", p.old, p.new, "; ".join(f"{c.field} {c.old} -> {c.new}" for c in p.changes)
              + (" (restarted in place)" if p.old in restarted else ""),
              signed_money(p.delta_price_per_hour)) for p in d.changed]
    rows += [("added", "", r.id, f"{r.shape} ({human.plural(r.gpus, 'GPU')})", signed_money(r.price_per_hour)) for r in d.added]
    rows += [("removed", r.id, "", f"{r.shape} ({human.plural(r.gpus, 'GPU')})", signed_money(-r.price_per_hour)) for r in d.removed]
    if rows:
        sections.append(Section("Replicas", (_table(("status", "old", "new", "what", "$/h"), rows),)))
    if d.routing:
        sections.append(Section("Routing weights", (_table(
            ("workload", "old replica", "new replica", "old", "new", "delta"),
            [(s.workload, s.old or "-", s.new or "-", num(s.old_weight), num(s.new_weight), signed(s.delta)) for s in d.routing]),)))
    if d.totals or d.workloads:
        blocks = []
        if d.totals:
            blocks.append(_table(("metric", "old", "new", "change"),
                                 [_metric_row(t.metric, t.old, t.new, t.delta) for t in d.totals]))
        if d.workloads:
            blocks.append(_table(
                ("workload", "served req/s", "capacity req/s", "p99 TTFT s", "p99 TPOT s"),
                [(w.workload, f"{num(w.old_served)} -> {num(w.new_served)}", f"{num(w.old_capacity)} -> {num(w.new_capacity)}",
                  f"{num(w.old_ttft_s)} -> {num(w.new_ttft_s)}", f"{num(w.old_tpot_s)} -> {num(w.new_tpot_s)}") for w in d.workloads]))
        sections.append(Section("Throughput, cost and latency", tuple(blocks)))
    if d.binding_added or d.binding_removed:
        sections.append(Section("What binds", tuple([f"- now: {b}" for b in d.binding_added] + [f"- no longer: {b}" for b in d.binding_removed])))
    mig: list[str | Table] = [
        f"Mode **{m.mode}**; ceiling {money(m.ceiling_per_hour)}, peak {money(m.peak_price_per_hour)}; capacity "
        + ("kept" if m.capacity_kept else "**dips**") + "."
    ]
    mig += [f"- {c}" for c in m.checks]
    if m.untouched:
        mig.append("Untouched (keep running): " + ", ".join(u.label for u in m.untouched) + ".")
    if m.steps:
        workloads = sorted({c.workload for s in m.steps for c in s.capacity})
        targets = {c.workload: c.target for s in m.steps for c in s.capacity}
        mig.append(_table(("#", "action", "replica", "$/h after", *[f"{w} req/s (target {num(targets[w])})" for w in workloads], "step"),
                          [_step_row(s, workloads) for s in m.steps]))
    else:
        mig.append("Nothing to do.")
    sections.append(Section("Migration", tuple(mig)))
    return Doc(f"Plan diff `{d.old.plan}` -> `{d.new.plan}`", tuple(intro), tuple(sections))
