"""Pictures for plan.md: the Mermaid pipeline diagram and SVG charts, functions of plan.json.

`pictures(plan)` (a PlanDoc, as plan.json has it) returns {"plan.md": <markdown block>, "charts/<name>.svg": <svg>}: the block
embeds diagram.mermaid (router -> replicas -> stages, grouped by region and cloud) and links
  charts/frontier.svg     cost vs served demand of compose's budget sweep, this plan marked
                          (when the plan has alternatives)
  charts/utilization.svg  per replica: busy share, and predicted TPOT against the SLO target
The backends take this function as an argument (emit.artifacts(ir, pictures=...)): they sit below
explain and must not import it.

SVGs are byte-stable: matplotlib's SVG backend (pinned in pyproject), text left as text
(svg.fonttype none: small files, the viewer's sans-serif), `svg.hashsalt` fixed, no date or creator
in the metadata, sorted inputs.
"""

from __future__ import annotations

import io

from hetcompile.explain import diagram
from hetcompile.explain.explain import explain_plan
from hetcompile.plan import human
from hetcompile.plan.doc import PlanDoc


def _figure():
    import matplotlib

    matplotlib.use("Agg")
    matplotlib.rcParams.update({"svg.hashsalt": "hetcompile", "svg.fonttype": "none", "font.family": "DejaVu Sans",
                                "font.size": 9, "axes.grid": True, "grid.alpha": 0.3})
    import matplotlib.pyplot as plt

    return plt


def _svg(fig) -> str:
    buf = io.StringIO()
    fig.savefig(buf, format="svg", metadata={"Date": None, "Creator": None}, bbox_inches=None)
    _figure().close(fig)
    return buf.getvalue()


def frontier_svg(plan: PlanDoc) -> str | None:
    front = sorted(plan.alternatives.frontier if plan.alternatives else (), key=lambda q: q.price_per_hour)
    if not front:
        return None
    plt = _figure()
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    pareto = [q for q in front if q.pareto]
    ax.plot([q.price_per_hour for q in pareto], [q.requests_per_s for q in pareto], "-o", color="#4c72b0",
            label="best plan at each budget (frontier)")
    other = [q for q in front if not q.pareto]
    if other:
        ax.plot([q.price_per_hour for q in other], [q.requests_per_s for q in other], "x", color="#999999",
                label="dominated")
    mine = [q for q in front if q.this_plan]
    for q in mine:
        ax.plot([q.price_per_hour], [q.requests_per_s], "*", markersize=16, color="#dd8452", label="this plan")
        ax.annotate(f"this plan: {human.money(q.price_per_hour)}, {human.number(q.requests_per_s)} req/s",
                    (q.price_per_hour, q.requests_per_s), textcoords="offset points", xytext=(8, -14))
    demand = sum(w.demand for w in plan.workloads if w.demand_kind == "rate")
    if demand:
        ax.axhline(demand, color="#55a868", linestyle="--", label=f"demand ({human.number(demand)} req/s)")
    ax.set_xlabel("plan cost ($/h)")
    ax.set_ylabel("served requests/s")
    ax.set_title(f"{plan.plan}: cost vs served demand")
    ax.legend(loc="lower right")
    fig.tight_layout()
    return _svg(fig)


MAX_BARS = 6  # TPOT bars per replica; beyond, workloads of one (TPOT, target) share a bar


def _tpot_rows(rid: str, loads: list[tuple[str, float]],
               slo: dict[str, float | None]) -> list[tuple[str, str, float, float | None]]:
    """(replica, label, TPOT, SLO target) bars of one replica: one per workload, or, for a replica
    serving more than MAX_BARS workloads (a spec of thousands: one bar each would take minutes to lay
    out and be unreadable), one per distinct (TPOT, target), labelled with its workload or
    'N workloads (first, ...)'."""
    if len(loads) <= MAX_BARS:
        return [(rid, w, v, slo.get(w)) for w, v in loads]
    groups: dict[tuple[float, float | None], list[str]] = {}
    for w, v in loads:
        groups.setdefault((round(v, 9), slo.get(w)), []).append(w)
    return [(rid, ws[0] if len(ws) == 1 else f"{len(ws)} workloads ({ws[0]}, ...)", v, target)
            for (v, target), ws in sorted(groups.items(), key=lambda kv: kv[1][0])]


def utilization_svg(plan: PlanDoc) -> str:
    e = explain_plan(plan)
    reps = e.replicas
    plt = _figure()
    slo = {w.name: w.slo.tpot_s if w.slo is not None else None for w in plan.workloads}
    fig, (busy, tpot) = plt.subplots(1, 2, figsize=(8.0, max(2.4, 0.45 * len(reps) + 1.2)))
    names = [r.id for r in reps][::-1]
    busy.barh(names, [100 * r.utilisation for r in reps][::-1], color="#4c72b0")
    busy.axvline(100, color="#c44e52", linestyle="--")
    busy.set_xlabel("busy (% of the replica's time)")
    busy.set_title("utilization per replica")
    rows = [row for r in reps for row in _tpot_rows(r.id, [(ld.workload, ld.tpot_s) for ld in r.workloads
                                                            if ld.weight > 0 and ld.tpot_s is not None], slo)]
    labels = [f"{rid} {w}" for rid, w, _, _ in rows][::-1]
    tpot.barh(labels, [1e3 * v for _, _, v, _ in rows][::-1], color="#8172b3")
    for i, (_, _, _, target) in enumerate(rows[::-1]):
        if target:
            tpot.plot([1e3 * target] * 2, [i - 0.4, i + 0.4], color="#c44e52", linewidth=2)
    tpot.set_xlabel("predicted TPOT ms (red: the SLO target)")
    tpot.set_title("latency per replica and workload")
    fig.tight_layout()
    return _svg(fig)


def pictures(plan: PlanDoc) -> dict[str, str]:
    """The plan.md block and the chart files it links (see module docstring)."""
    files: dict[str, str] = {}
    lines = ["## Pictures", "",
             "The replicas as the router sees them (grouped by region and cloud; edge labels are routing weights, "
             "box titles GPU type, TP/PP and busy share; the heaviest stage of a pipeline is drawn thick):", "",
             "```mermaid", diagram.mermaid(explain_plan(plan)).rstrip("\n"), "```", ""]
    front = frontier_svg(plan)
    if front is not None:
        files["charts/frontier.svg"] = front
        lines.append("- [cost vs served demand](charts/frontier.svg): compose's budget sweep, this plan marked")
    if plan.replicas:
        files["charts/utilization.svg"] = utilization_svg(plan)
        lines.append("- [utilization and TPOT per replica](charts/utilization.svg): busy share, and predicted TPOT "
                     "against the SLO target")
    files["plan.md"] = "\n".join(lines) + "\n"
    return files
