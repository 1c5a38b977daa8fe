"""Workload rates for a fixed set of replicas: compose's LP with the replica counts fixed.

After `place` re-places a model's layers (mixed pipelines), the replicas are no longer compose's
shapes, so their shares of each workload are recomputed. Replicas r of one model, workloads w
with demand lambda_w, h_{r,w} = requests/s replica r serves when it serves only w:

    max theta   s.t.   sum_w x_{r,w} / h_{r,w} <= 1        (every replica busy at most 100%)
                       sum_r x_{r,w} = theta * lambda_w    (the demand mix, scaled)
                       x >= 0

theta is seed 003's scale (the multiple of the demand mix served); x_{r,w} / (theta lambda_w) are
the routing weights. Models do not share replicas, so each model is its own LP and the plan's
scale is the smallest theta over models.

Paper: Jiang et al., "Demystifying Cost-Efficiency in LLM Serving over Heterogeneous GPUs" (seed 003), §4.3 eq. 2-4 (coverage and capacity rows with the replica counts fixed).
"""

from __future__ import annotations

from collections.abc import Mapping

import pyomo.core as pyo

from hetcompile.errors import SolverError
from hetcompile.opt.solve import SolverOptions, solve


def max_scale(
    capacity: Mapping[str, Mapping[str, float]], demand: Mapping[str, float], options: SolverOptions, *, name: str
) -> tuple[float, dict[tuple[str, str], float]]:
    """(theta, {(replica, workload): x}) for `capacity[r][w]` = h_{r,w} and `demand[w]` = lambda_w."""
    reps = sorted(capacity)
    ws = sorted(demand)
    pairs = [(r, w) for r in reps for w in ws if capacity[r].get(w, 0.0) > 0]
    if not pairs:
        return 0.0, {}
    m = pyo.ConcreteModel(name=name)
    m.x = pyo.Var(pairs, domain=pyo.NonNegativeReals)
    m.theta = pyo.Var(domain=pyo.NonNegativeReals)
    m.busy = pyo.Constraint(reps, rule=lambda m, r: sum(m.x[r, w] / capacity[r][w] for w in ws if (r, w) in m.x) <= 1)

    def served(m, w):
        terms = [m.x[r, w] for r in reps if (r, w) in m.x]
        return (sum(terms) if terms else 0) == m.theta * demand[w]

    m.served = pyo.Constraint(ws, rule=served)
    m.obj = pyo.Objective(expr=m.theta, sense=pyo.maximize)
    res = solve(m, options, name=name)
    if not res.has_solution:
        raise SolverError(f"{name}: the rate LP ended {res.status}")
    theta = float(pyo.value(m.theta))
    return theta, {k: float(pyo.value(m.x[k])) for k in pairs if pyo.value(m.x[k]) > 1e-12}
