"""A plan's prefill/decode groups in words, one rendering for plan.md and `explain` (issue 35)."""

from __future__ import annotations

from hetcompile.plan import human
from hetcompile.plan.doc import PlanDoc, PlanGroup


def group_picture(plan: PlanDoc, g: PlanGroup) -> str:
    """One line: the workload into its prefill replicas, the KV link, the decode replicas, the tokens."""
    reps = {r.id: r for r in plan.replicas}
    p0, d0 = reps[next(iter(g.prefill))], reps[next(iter(g.decode))]
    seqs = d0.workloads[g.workload].concurrency if g.workload in d0.workloads else None
    return (f"{g.workload} --> [prefill {', '.join(g.prefill)}: {p0.stages[0].gpu} TP{p0.tp} x{len(g.prefill)}] "
            f"==KV {human.number(g.transfer_s * 1000)} ms==> [decode {', '.join(g.decode)}: {d0.stages[0].gpu} TP{d0.tp} "
            f"x{len(g.decode)}{f', {human.number(seqs)} sequences each' if seqs is not None else ''}] --> tokens")


def versus(plan: PlanDoc) -> list[str]:
    """The plan beside the same spec built without groups (plan.json `aggregated`), one line each."""
    a = plan.aggregated
    if a is None:
        return []
    t = plan.totals
    out = [f"with groups: {human.number(t.scale)}x the demand for {human.money(t.price_per_hour)} on "
           f"{human.plural(len(plan.replicas), 'replica')}; without: {human.number(a.scale)}x for "
           f"{human.money(a.price_per_hour)} on {human.plural(a.replicas, 'replica')}"
           + (" (both verified by simulation)" if a.verified and plan.verification is not None else "")]
    alt = {w.name: w for w in a.workloads}
    for w in plan.workloads:
        tail, other = w.simulated or w.predicted, alt.get(w.name)
        if tail is None or other is None:
            continue
        out.append(f"{w.name}: p99 TTFT {human.number(tail.ttft_s)} s, TPOT {human.number(tail.tpot_s)} s with groups; "
                   f"{human.number(other.ttft_s)} s, {human.number(other.tpot_s)} s without")
    return out
