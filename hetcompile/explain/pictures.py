"""Pictures for plan.md: the Mermaid pipeline diagram and SVG charts, functions of plan.json.

`pictures(plan)` (a PlanDoc, as plan.json has it) returns {"plan.md": <markdown block>, "charts/<name>.svg": <svg>}: the block
embeds diagram.mermaid (router -> replicas -> stages, grouped by region and cloud) and links
  charts/frontier.svg     cost vs served demand of compose's budget sweep, this plan marked
                          (when the plan has alternatives)
  charts/utilization.svg  per replica: busy share, and predicted TPOT against the SLO target
The backends take this function as an argument (emit.artifacts(ir, pictures=...)): they sit below
explain and must not import it.

The SVGs are written by explain/svg.py (no plotting library: matplotlib's import alone was most
of a small build's time): byte-stable, text left as text, sorted inputs.
"""

from __future__ import annotations

from hetcompile.explain import diagram, svg
from hetcompile.explain.explain import explain_plan
from hetcompile.plan import human
from hetcompile.plan.doc import PlanDoc


def frontier_svg(plan: PlanDoc) -> str | None:
    front = sorted(plan.alternatives.frontier if plan.alternatives else (), key=lambda q: q.price_per_hour)
    if not front:
        return None
    pareto = [q for q in front if q.pareto]
    other = [q for q in front if not q.pareto]
    mine = [q for q in front if q.this_plan]
    demand = sum(w.demand for w in plan.workloads if w.demand_kind == "rate")
    xs = [q.price_per_hour for q in front]
    ys = [q.requests_per_s for q in front] + ([demand] if demand else [])
    xt = svg.nice_ticks(min(xs), max(xs))
    yt = svg.nice_ticks(min(0.0, min(ys)), 1.05 * max(ys))
    doc = svg.Svg(640, 400)
    left, right, top, bottom = 80, 620, 30, 350
    ax, ay = svg.Axis(xt[0], xt[-1], left, right), svg.Axis(yt[0], yt[-1], bottom, top)
    svg.x_axis(doc, ax, xt, top, bottom, "plan cost ($/h)")
    svg.y_axis(doc, ay, yt, left, right, "served requests/s")
    doc.text((left + right) / 2, top - 10, f"{plan.plan}: cost vs served demand", "middle", bold=True)
    items = [("o", "#4c72b0", "best plan at each budget (frontier)")]
    if demand:
        doc.line(left, ay(demand), right, ay(demand), "#55a868", 1.5, "5,3")
    doc.polyline([(ax(q.price_per_hour), ay(q.requests_per_s)) for q in pareto], "#4c72b0")
    for q in pareto:
        doc.marker("o", ax(q.price_per_hour), ay(q.requests_per_s), "#4c72b0")
    if other:
        items.append(("x", "#999999", "dominated"))
        for q in other:
            doc.marker("x", ax(q.price_per_hour), ay(q.requests_per_s), "#999999")
    for q in mine:
        items.append(("*", "#dd8452", "this plan"))
        x, y = ax(q.price_per_hour), ay(q.requests_per_s)
        doc.marker("*", x, y, "#dd8452", 9.0)
        label = f"this plan: {human.money(q.price_per_hour)}, {human.number(q.requests_per_s)} req/s"
        right_side = x + 10 + svg.text_width(label) <= right
        doc.text(x + 10 if right_side else x - 10, y + 16, label, "start" if right_side else "end")
    if demand:
        items.append(("--", "#55a868", f"demand ({human.number(demand)} req/s)"))
    svg.legend(doc, left, top, items)  # the frontier rises to the right: its upper left is empty
    return doc.render()


MAX_BARS = 6  # TPOT bars per replica; beyond, workloads of one (TPOT, target) share a bar
BAR_ROW = 30  # px per bar


def _tpot_rows(rid: str, loads: list[tuple[str, float]],
               slo: dict[str, float | None]) -> list[tuple[str, str, float, float | None]]:
    """(replica, label, TPOT, SLO target) bars of one replica: one per workload, or, for a replica
    serving more than MAX_BARS workloads (a spec of thousands: one bar each would be unreadable),
    one per distinct (TPOT, target), labelled with its workload or 'N workloads (first, ...)'."""
    if len(loads) <= MAX_BARS:
        return [(rid, w, v, slo.get(w)) for w, v in loads]
    groups: dict[tuple[float, float | None], list[str]] = {}
    for w, v in loads:
        groups.setdefault((round(v, 9), slo.get(w)), []).append(w)
    return [(rid, ws[0] if len(ws) == 1 else f"{len(ws)} workloads ({ws[0]}, ...)", v, target)
            for (v, target), ws in sorted(groups.items(), key=lambda kv: kv[1][0])]


def _bars(doc: svg.Svg, x0: float, x1: float, top: float, labels: list[str], values: list[float], color: str,
          title: str, xlabel: str, vline: float | None = None, marks: list[float | None] | None = None) -> None:
    """A horizontal bar panel: one row of BAR_ROW px per label, top to bottom, labels right-aligned left
    of x0; `vline` a dashed red line across every row, `marks` a red tick per row (None: none)."""
    bottom = top + BAR_ROW * len(labels)
    hi = max([*values, vline or 0.0, *[m for m in marks or () if m]], default=1.0) * 1.05
    xt = svg.nice_ticks(0.0, hi)
    ax = svg.Axis(xt[0], xt[-1], x0, x1)
    svg.x_axis(doc, ax, xt, top, bottom, xlabel)
    doc.text((x0 + x1) / 2, top - 10, title, "middle", bold=True)
    for k, (label, v) in enumerate(zip(labels, values)):
        y = top + BAR_ROW * k
        doc.rect(x0, y + 0.15 * BAR_ROW, ax(v) - x0, 0.7 * BAR_ROW, color)
        doc.text(x0 - 4, y + BAR_ROW / 2 + svg.FONT_PX / 3, label, "end")
        mark = (marks or [None] * len(labels))[k]
        if mark:
            doc.line(ax(mark), y + 0.1 * BAR_ROW, ax(mark), y + 0.9 * BAR_ROW, "#c44e52", 2.0)
    if vline is not None:
        doc.line(ax(vline), top, ax(vline), bottom, "#c44e52", 1.5, "5,3")


def utilization_svg(plan: PlanDoc) -> str:
    e = explain_plan(plan)
    reps = e.replicas
    slo = {w.name: w.slo.tpot_s if w.slo is not None else None for w in plan.workloads}
    rows = [row for r in reps for row in _tpot_rows(r.id, [(ld.workload, ld.tpot_s) for ld in r.workloads
                                                            if ld.weight > 0 and ld.tpot_s is not None], slo)]
    names = [r.id for r in reps]
    labels = [f"{rid} {w}" for rid, w, _, _ in rows]
    left_w = 8 + max(svg.text_width(n) for n in names)
    right_w = 8 + max((svg.text_width(t) for t in labels), default=0.0)
    panel = 300.0
    width = left_w + panel + 40 + right_w + panel + 20
    top = 30
    height = top + BAR_ROW * max(len(names), len(rows), 1) + 50
    doc = svg.Svg(width, height)
    x0 = left_w
    _bars(doc, x0, x0 + panel, top, names, [100 * r.utilisation for r in reps], "#4c72b0",
          "utilization per replica", "busy (% of the replica's time)", vline=100.0)
    x0 += panel + 40 + right_w
    _bars(doc, x0, x0 + panel, top, labels, [1e3 * v for _, _, v, _ in rows], "#8172b3",
          "latency per replica and workload", "predicted TPOT ms (red: the SLO target)",
          marks=[1e3 * t if t else None for _, _, _, t in rows])
    return doc.render()


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
