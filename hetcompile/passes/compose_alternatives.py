"""compose's alternatives: the cost vs served-demand frontier and the runners-up that lost.

Both are re-solves of the same composition MILP (same tables, same work budget), bounded:

  frontier    a parametric budget sweep: for each B_k in BUDGET_FACTORS x B (and the least $/h
              that serves the whole demand, when compose's what-if found one), max theta at B_k
              (starting from this plan where B_k > B), then the cheapest plan at that theta (the
              two stages compose itself runs). The
              points that no other point beats on both $/h and theta form the Pareto frontier;
              this plan is marked. 2 solves per point, len(BUDGET_FACTORS) + 1 points at most.
  runners-up  for each replica shape the plan uses (at most MAX_RUNNERS, by served share), the best
              plan without that shape at the same budget: what the plan would be had compose not
              picked it, and the one reason it lost (serves less, or the same for more $/h), with
              the mean TPOT of both so a latency trade is visible.

Notation as in compose_model: theta (x the demand mix), B the budget ($/s in the tables).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Callable

from hetcompile.plan import human
from hetcompile.ir.problem import Problem
from hetcompile.plan.doc import Alternatives, FrontierPoint, RunnerUp
from hetcompile.passes.compose_model import ComposeSolution, ComposeTables
from hetcompile.passes.profile_pd import group_workload

BUDGET_FACTORS = (0.25, 0.5, 0.75, 1.5, 2.0)
MAX_RUNNERS = 3
THETA_KEEP = 1 - 1e-6

Solver = Callable[..., ComposeSolution | None]  # (tables, name, objective, **kw) -> solution


def applies(ir: Problem) -> bool:
    return (ir.objective == "max-throughput" and ir.previous is None and ir.budget_per_s is not None
            and bool(ir.workloads) and all(w.demand_kind == "rate" for w in ir.workloads))


def _best(t: ComposeTables, solve: Solver, name: str, start: ComposeSolution | None = None) -> ComposeSolution | None:
    """The two stages compose runs (max theta, then the cheapest plan at it); `start`: a plan feasible
    at this budget, handed to the first stage as its incumbent."""
    first = solve(t, name, "theta", start=start)
    if first is None or first.theta <= 0:
        return first
    second = solve(t, name + "/cost", "cost", start=first, theta_min=first.theta * THETA_KEEP)
    return second or first


def mean_tpot(ir: Problem, sol: ComposeSolution) -> float | None:
    """Rate-weighted mean TPOT of a composition's served requests (the shapes' own estimates)."""
    tpot = {(s.id, w): v for s in ir.shapes or () for w, v in s.estimate.tpot_s}
    num = den = 0.0
    for (c, w), r in sol.r.items():
        if r > 1e-12 and (c, w) in tpot:
            num += r * tpot[(c, w)]
            den += r
    return num / den if den > 0 else None


def _shape_label(ir: Problem, c: str) -> str:
    s = next(x for x in ir.shapes or () if x.id == c)
    role = f", {s.role} of {group_workload(s.group)}" if s.role is not None and s.group is not None else ""  # a phase shape
    return f"{s.tp * s.pp}x {s.gpu} in {s.region} (tp={s.tp}, pp={s.pp}{role})"


def frontier(ir: Problem, t: ComposeTables, sol: ComposeSolution, solve: Solver,
             full_demand_per_h: float | None) -> tuple[FrontierPoint, ...]:
    total = sum(t.demand.values())
    assert t.budget is not None  # applies(): only with a budget
    points = [FrontierPoint(budget_per_hour=t.budget * 3600, price_per_hour=sol.cost * 3600, scale=sol.theta,
                            requests_per_s=sol.theta * total, this_plan=True, tpot_s=mean_tpot(ir, sol))]
    budgets = sorted({round(t.budget * f * 3600, 6) for f in BUDGET_FACTORS}
                     | ({round(full_demand_per_h, 6)} if full_demand_per_h else set()))
    for b in budgets:
        if abs(b - t.budget * 3600) < 1e-9:
            continue
        # above this plan's budget the plan itself is feasible: the re-solve starts from it, so a point
        # stopped at the work budget never serves less than the plan (scale1072's 1.5x point had)
        alt = _best(replace(t, budget=b / 3600), solve, f"compose/frontier-{human.money(b)}",
                    start=sol if b > t.budget * 3600 else None)
        if alt is None or alt.theta <= 0:
            continue
        points.append(FrontierPoint(budget_per_hour=b, price_per_hour=alt.cost * 3600, scale=alt.theta,
                                    requests_per_s=alt.theta * total, this_plan=False, tpot_s=mean_tpot(ir, alt)))
    # the same plan reached from several budgets is one point (the lowest budget that buys it)
    seen, unique = set(), []
    for p in sorted(points, key=lambda p: (not p.this_plan, p.budget_per_hour)):
        key = (round(p.price_per_hour, 6), round(p.scale, 6))
        if key not in seen:
            seen.add(key)
            unique.append(p)
    points = unique
    # Pareto: keep a point unless another serves at least as much for no more money (and is not the same)
    out = []
    for p in points:
        dominated = any(q is not p and q.price_per_hour <= p.price_per_hour + 1e-9 and q.scale >= p.scale * (1 + 1e-6)
                        for q in points)
        out.append(p.model_copy(update={"pareto": not dominated}))
    return tuple(sorted(out, key=lambda p: (p.budget_per_hour, not p.this_plan)))


def runners_up(ir: Problem, t: ComposeTables, sol: ComposeSolution, solve: Solver) -> tuple[RunnerUp, ...]:
    total = sum(t.demand.values())
    served: dict[str, float] = {}
    for (c, _), r in sol.r.items():
        served[c] = served.get(c, 0.0) + r
    used = sorted((c for c, n in sol.y.items() if n > 0), key=lambda c: (-served.get(c, 0.0), c))[:MAX_RUNNERS]
    mine = mean_tpot(ir, sol)
    out = []
    for c in used:
        keep = tuple(s for s in t.shapes if s != c)
        alt = _best(replace(t, shapes=keep, h={k: v for k, v in t.h.items() if k[0] != c}), solve, f"compose/without-{c}")
        label = _shape_label(ir, c)
        if alt is None or alt.theta <= 0:
            out.append(RunnerUp(without=c, label=label, price_per_hour=None, scale=0.0, requests_per_s=0.0,
                                text=f"without {label}: no plan serves anything within the budget"))
            continue
        tp = mean_tpot(ir, alt)
        picked = ", ".join(f"{human.plural(n, 'replica')} of {_shape_label(ir, s)}" for s, n in sorted(alt.y.items()) if n > 0)
        if alt.theta < sol.theta * (1 - 1e-6):
            why = f"serves {human.percent(1 - alt.theta / sol.theta)} less ({human.number(alt.theta * total)} req/s)"
        elif alt.cost > sol.cost * (1 + 1e-9):
            why = f"serves as much for {human.money(alt.cost * 3600)} (+{human.money((alt.cost - sol.cost) * 3600)})"
        else:
            why = "ties this plan (compose kept the first optimum it found)"
        lat = ""
        if tp is not None and mine is not None:
            lat = f"; mean TPOT {1e3 * tp:.0f} ms vs this plan's {1e3 * mine:.0f} ms"
        out.append(RunnerUp(without=c, label=label, price_per_hour=alt.cost * 3600, scale=alt.theta,
                            requests_per_s=alt.theta * total, tpot_s=tp,
                            text=f"without {label}: {picked}; {why}{lat}"))
    return tuple(out)


def analyse(ir: Problem, t: ComposeTables, sol: ComposeSolution, solve: Solver,
            full_demand_per_h: float | None) -> Alternatives:
    return Alternatives(frontier=frontier(ir, t, sol, solve, full_demand_per_h), runners_up=runners_up(ir, t, sol, solve))
