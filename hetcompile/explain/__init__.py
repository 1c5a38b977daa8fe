"""Explain a plan and diff two plans: `hetcompile explain PLAN [NEW]`.

- `load.read_plan`        a plan.json (or OUT directory) -> `PlanDoc`, with a clear error otherwise
- `rates`                 the load arithmetic shared by everything below (notation there)
- `explain.explain_plan`  PlanDoc -> `model.Explanation`
- `diff.diff_plans`       two PlanDocs, their matching (`diff.match`) and the migration planned
                          from it -> `model.PlanDiff` (hetcompile.migrate.planner.plan_diff does
                          all three: migrate sits above explain and reuses its matching and models)
- `render_*`              terminal (rich), markdown with Mermaid, Graphviz DOT

Everything here is a pure function of `PlanDoc`s (hetcompile/plan/doc.py), read by typed field:
no solver, no catalog, no clock, so the output is byte-stable and goldens can pin it.
"""

from hetcompile.explain.diff import diff_plans
from hetcompile.explain.explain import explain_plan
from hetcompile.explain.load import PlanReadError, read_plan

__all__ = ["PlanReadError", "diff_plans", "explain_plan", "read_plan"]
