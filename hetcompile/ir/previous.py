"""A previous plan as replanning input (`hetcompile build SPEC --previous OLD/plan.json`).

Reading and validating the file is `hetcompile.plan.io.read_plan_doc`; this keeps what compose
and place need: the running replicas, the old objective, and the replica ids already handed out.
"""

from __future__ import annotations

from hetcompile.plan.doc import PlanDoc
from hetcompile.ir.problem import PreviousPlan, PreviousReplica

DEFAULT_CHURN_PENALTY = 0.01  # a replica launched or torn down is worth 1% of the previous objective


def previous_plan(doc: PlanDoc, churn_penalty: float = DEFAULT_CHURN_PENALTY) -> PreviousPlan:
    reps = tuple(PreviousReplica(id=r.id, model=r.model, shape=r.shape, nodes=tuple(s.node for s in r.stages))
                 for r in doc.replicas)
    return PreviousPlan(plan=doc.plan, replicas=reps, scale=doc.totals.scale,
                        price_per_s=doc.totals.price_per_hour / 3600.0, churn_penalty=churn_penalty,
                        next_replica=doc.next_replica)
