"""compose's what-if: what it would take to serve the whole demand, and what one more step buys.

A bounded number of re-solves of the same composition MILP (same tables, same work budget), so
the answers are exactly what compose would choose, not a linear approximation:

  full demand   min cost with theta = 1 and no budget row: the least $/h that meets every workload
                rate within availability (the price a min-cost build of the same spec reports).
                When availability cannot meet it: max theta with no budget row instead.
                Where verification left workloads a share f_w < 1 of the tail model's load, h_{c,w}
                carries it, and a min-cost build's own verification searches its own shares: the
                same re-solve at f_w = 1 (h_{c,w} / f_w) is then the floor (no verified plan is
                cheaper: every f_w <= 1 and the cost only grows as h shrinks), and the price at this
                plan's shares the figure a min-cost build reaches when it needs the same margins.
  budget        max theta at B + s, s = max($1/h, the cheapest replica's price): what more money
                buys (MILP: a step smaller than one replica buys nothing, so s is one replica)
  availability  max theta with a_o + one more replica's nodes (the smallest shape the plan uses on
                that offer) for each offer that binds, at most MAX_OFFERS of them (by id)

Only for max-throughput plans whose workloads all have rates (so theta x demand is req/s) and
without --previous (the churn term would make the answers about churn, not capacity).
Notation as in compose_model: theta (x the demand mix), lambda_w, a_o, B.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Callable

from hetcompile.plan import human
from hetcompile.ir.problem import Problem
from hetcompile.plan.doc import Binding, Marginal, WhatItWouldTake
from hetcompile.passes.compose_model import ComposeSolution, ComposeTables, solution_cost

MAX_OFFERS = 4  # availability re-solves per build: keeps the extra build time bounded
GAIN = 1e-5  # a theta gain below this share of theta is solver noise, not a constraint that binds

Solver = Callable[..., ComposeSolution | None]  # (tables, name, objective, start=None) -> solution; `start` is a plan
                                                # feasible for the re-solve (more budget or nodes keep this plan)


def applies(ir: Problem) -> bool:
    return (ir.objective == "max-throughput" and ir.previous is None and bool(ir.workloads)
            and all(w.demand_kind == "rate" for w in ir.workloads))


def _gpus_per_node(ir: Problem, offer: str) -> int:
    return next(o.gpus_per_node for o in ir.offers if o.id == offer)


def analyse(ir: Problem, t: ComposeTables, sol: ComposeSolution, binding: tuple[Binding, ...],
            solve: Solver) -> WhatItWouldTake:
    total = sum(t.demand.values())  # req/s: every workload has a rate
    solves = 0
    lines: list[str] = []
    full_price = max_scale = None
    free = replace(t, budget=None)
    full = solve(free, "compose/what-if-full-demand", "cost")
    solves += 1
    floor_price = None
    if full is not None and (factors := dict(ir.tail_factors)):
        at_one = replace(free, h={(c, w): v / factors.get(w, 1.0) for (c, w), v in t.h.items()})
        floor = solve(at_one, "compose/what-if-full-demand-tail-model", "cost")
        solves += 1
        floor_price = floor.cost * 3600 if floor is not None and floor.cost < full.cost * (1 - 1e-9) else None
    if full is not None:
        full_price = full.cost * 3600
        where = "within" if t.budget is None or full.cost <= t.budget * (1 + 1e-9) else "above"
        budget = f", {where} the {human.money(t.budget * 3600)} budget" if t.budget is not None else ""
        if full_price <= 1e-9:  # owned GPUs (or ones offered at $0/h) carry all of it: no price to state
            lines.append(f"Serving 100% of the demand ({human.si(total)} req/s, every SLO met) needs no rented GPU: "
                         "the owned ones (and any offered at $0/h) serve all of it in a min-cost build of this spec.")
        elif floor_price is None:
            lines.append(f"Serving 100% of the demand ({human.si(total)} req/s, every SLO met) takes "
                         f"{human.money(full_price)} at least{budget}: a min-cost build of this spec, more where "
                         "its own simulation asks for margins.")
        else:
            shares = _shares_text(ir.tail_factors)
            lines.append(f"Serving 100% of the demand ({human.si(total)} req/s, every SLO met) takes "
                         f"{human.money(floor_price)} to {human.money(full_price)}{budget}: a min-cost build of this "
                         f"spec costs {human.money(floor_price)} where its simulation holds the SLOs at the tail "
                         f"model's load, {human.money(full_price)} where it needs this plan's margins ({shares} of "
                         "that load).")
    else:
        most = solve(free, "compose/what-if-no-budget", "theta", start=sol)
        solves += 1
        max_scale = most.theta if most is not None else None
        lines.append("No budget serves 100% of the demand: the offered GPUs reach "
                     f"{human.percent(max_scale) if max_scale is not None else 'nothing'} of it at most; offer more GPUs.")
    marginals: list[Marginal] = []
    if t.budget is not None:
        cheapest = min((solution_cost({c: 1}, t) for c in t.shapes if solution_cost({c: 1}, t) > 0), default=0.0)
        step = max(1.0 / 3600, cheapest)
        more = solve(replace(t, budget=t.budget + step), "compose/what-if-budget", "theta", start=sol)
        solves += 1
        if more is not None:
            marginals.append(_marginal("budget", None, f"+{human.money(step * 3600)} budget", step * 3600,
                                       more.theta - sol.theta, total, sol.theta))
    offers = sorted({b.subject for b in binding if b.kind == "availability" and b.subject})[:MAX_OFFERS]
    for o in offers:
        g = _gpus_per_node(ir, o)
        # one more replica's worth: a deep pipeline gains nothing from a single extra node
        need = min((t.shape_gpus[c] for c in t.shapes if t.shape_offer[c] == o and sol.y.get(c, 0) > 0),
                   default=g)
        nodes = -(-need // g)
        more = solve(replace(t, avail={**t.avail, o: t.avail[o] + nodes * g}), f"compose/what-if-{o}", "theta",
                     start=sol)
        solves += 1
        if more is not None:
            marginals.append(_marginal("availability", o, f"+{human.plural(nodes, 'node')} of {o} "
                                       f"({human.plural(nodes * g, 'GPU')})", None, more.theta - sol.theta, total, sol.theta))
    return WhatItWouldTake(full_demand_price_per_hour=full_price, full_demand_floor_per_hour=floor_price,
                           max_scale_without_budget=max_scale,
                           marginals=tuple(marginals), solves=solves, text=tuple(lines))


def _shares_text(factors: tuple[tuple[str, float], ...]) -> str:
    """'chat 56.9%, rag 80%'; workloads at one share counted, not listed ('3000 workloads (chat0000, ...) 48.8%'): a
    spec of thousands of workloads keeps a one-line sentence."""
    by: dict[float, list[str]] = {}
    for w, f in sorted(factors):
        by.setdefault(f, []).append(w)
    return ", ".join((ws[0] if len(ws) == 1 else f"{len(ws)} workloads ({ws[0]}, ...)") + " " + human.percent(f)
                     for f, ws in sorted(by.items()))


def _marginal(kind: str, subject: str | None, step: str, per_hour: float | None, delta: float, total: float,
              theta: float) -> Marginal:
    delta = delta if abs(delta) > GAIN * max(theta, 1e-9) else 0.0
    rps = delta * total
    text = (f"{step} buys +{human.number(rps)} req/s (+{human.percent(delta)} of the demand)" if delta > 0
            else f"{step} alone buys nothing: another constraint binds too")
    return Marginal(kind=kind, subject=subject, step=step, step_per_hour=per_hour, scale_delta=delta,
                    requests_per_s_delta=rps, text=text)


def bindings_from_marginals(binding: tuple[Binding, ...], w: WhatItWouldTake, used_per_h: float,
                            budget_per_h: float | None) -> tuple[Binding, ...]:
    """`binding` plus the budget when more budget buys more (the re-solve is the proof; the
    'no further replica fits' test misses budgets that leave room for a replica that cannot raise
    theta, e.g. one model's replica when every model must grow together)."""
    budget = next((m for m in w.marginals if m.kind == "budget"), None)
    out = [b.model_copy(update={"text": f"{b.text}; {budget.text}"}) if b.kind == "budget" and budget is not None
           and budget.scale_delta <= 0 else b for b in binding]
    if budget is not None and budget.scale_delta > 0 and budget_per_h is not None \
            and not any(b.kind == "budget" for b in out):
        out.insert(0, Binding(kind="budget", used=used_per_h, limit=budget_per_h, unit="$/h",
                              text=f"budget: {human.money(used_per_h)} of {human.money(budget_per_h)} used; "
                                   f"{budget.text}"))
    return tuple(out)
