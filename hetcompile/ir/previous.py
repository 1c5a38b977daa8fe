"""A previous plan as replanning input (`hetcompile build SPEC --previous OLD/plan.json`).

Reading and checking the file is explain's `read_plan`; this keeps what compose and place need.
"""

from __future__ import annotations

from hetcompile.ir.errors import HetcompileError
from hetcompile.ir.problem import PreviousPlan, PreviousReplica

DEFAULT_CHURN_PENALTY = 0.01  # a replica launched or torn down is worth 1% of the previous objective


def previous_plan(data: dict, churn_penalty: float = DEFAULT_CHURN_PENALTY) -> PreviousPlan:
    """`data`: a plan.json dict that `hetcompile.explain.load.check_plan` accepted."""
    try:
        reps = tuple(
            PreviousReplica(id=r["id"], model=r["model"], shape=r["shape"], nodes=tuple(s["node"] for s in r["stages"]))
            for r in data["replicas"]
        )
        t = data["totals"]
        return PreviousPlan(plan=data["plan"], replicas=reps, scale=float(t["scale"]),
                            price_per_s=float(t["price_per_hour"]) / 3600.0, churn_penalty=churn_penalty)
    except (ValueError, KeyError, TypeError) as exc:
        raise HetcompileError(f"the previous plan {data.get('plan')!r} is not a hetcompile plan.json ({exc!r})",
                              hint="pass the plan.json (or the output directory) of an earlier `hetcompile build`") from None
