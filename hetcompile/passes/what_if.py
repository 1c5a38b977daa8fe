"""Pass 8, what-if: what the plan would gain from more, and what compose weighed against it.

Re-solves compose's MILP (compose_model.py) around the solution compose chose (`Composition.composed`:
y, r, theta), on the tables of the final IR (the tail factors verification settled on):

  what_if       the price of serving all demand (a min-cost build at theta = 1), and the marginal
                theta of one more budget step and of one more node of each binding offer
                (compose_whatif.py); a budget whose step buys more theta is added to `binding`
  alternatives  the budget frontier and the runners-up without each used shape (compose_alternatives.py)

It runs once per build, after verify: verification's replans re-run the passes before it, and the
explanation of a plan that verification throws away was half of a large spec's compose time
(bench/data/scale1072.yaml). Each re-solve gets compose.EXPLAIN_NODES branch-and-bound nodes at most
and starts, where it can, from the plan itself (a what-if that only adds budget or nodes never
reports less than the plan).

Paper: Jiang et al., "Demystifying Cost-Efficiency in LLM Serving over Heterogeneous GPUs" (seed 003), §4.3
(the MILP); the marginals are re-solves of it, not duals, since y is integer.
"""

from __future__ import annotations

from hetcompile.ir.problem import PassReport, Problem
from hetcompile.passes import compose_alternatives, compose_whatif
from hetcompile.passes.base import Pass, PassContext
from hetcompile.passes.compose import SolveLog, solve_composition, tables
from hetcompile.passes.compose_model import ComposeSolution, ComposeTables, solution_cost


def composed_solution(ir: Problem, t: ComposeTables) -> ComposeSolution:
    """compose's solution from the IR: y_c and r_{c,w} as compose chose them (zero where it bought
    or routed nothing), theta, and the cost of y."""
    assert ir.composition is not None and ir.composition.composed is not None  # compose wrote it
    chosen = ir.composition.composed
    y = {c: 0 for c in t.shapes} | dict(chosen.counts)
    r = {cw: 0.0 for cw in t.h} | {(c, w): v for c, w, v in chosen.rates}
    return ComposeSolution(y=y, r=r, theta=chosen.scale, cost=solution_cost(y, t))


class WhatIf(Pass):
    name = "what-if"
    requires = ("composition",)
    provides = ""  # composition.what_if and .alternatives, where they apply (module docstring)

    def run(self, ir: Problem, ctx: PassContext) -> Problem:
        comp = ir.composition
        assert comp is not None  # required
        whatif, alternatives = compose_whatif.applies(ir), compose_alternatives.applies(ir)
        if comp.composed is None or not (whatif or alternatives):
            why = ("the what-if and alternatives apply to max-throughput plans of rate workloads without --previous"
                   if comp.composed is not None else "compose recorded no solution to re-solve around")
            return ir.model_copy(update={"reports": (*ir.reports, PassReport(
                name=self.name, status="skipped", time_s=0.0, notes=(why,)))})
        t = tables(ir)
        sol = composed_solution(ir, t)
        log = SolveLog(ctx.solver).explainer()
        binding, what_if, alts = comp.binding, None, None
        if whatif:
            what_if = compose_whatif.analyse(
                ir, t, sol, binding, lambda tt, name, obj, **kw: solve_composition(tt, log, name, obj, **kw)[1])
            binding = compose_whatif.bindings_from_marginals(
                binding, what_if, sol.cost * 3600, t.budget * 3600 if t.budget is not None else None)
        if alternatives:
            alts = compose_alternatives.analyse(
                ir, t, sol, lambda tt, name, obj, **kw: solve_composition(tt, log, name, obj, **kw)[1],
                what_if.full_demand_price_per_hour if what_if is not None else None)
        notes = (f"{len(log.results)} re-solves of the composition MILP around this plan", *log.notes())
        report = PassReport(name=self.name, status="ok", time_s=0.0, notes=notes)  # the manager stamps the time
        return ir.model_copy(update={
            "composition": comp.model_copy(update={"binding": binding, "what_if": what_if, "alternatives": alts}),
            "reports": (*ir.reports, report),
        })
