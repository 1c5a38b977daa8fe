"""Read a previous plan.json for replanning (`hetcompile build SPEC --previous OLD/plan.json`)."""

from __future__ import annotations

import json
from pathlib import Path

from hetcompile.ir.errors import HetcompileError
from hetcompile.ir.problem import PreviousPlan, PreviousReplica

DEFAULT_CHURN_PENALTY = 0.01  # a replica launched or torn down is worth 1% of the previous objective


def read_previous(path: Path, churn_penalty: float = DEFAULT_CHURN_PENALTY) -> PreviousPlan:
    path = path / "plan.json" if path.is_dir() else path
    try:
        data = json.loads(path.read_text())
        reps = tuple(
            PreviousReplica(id=r["id"], model=r["model"], shape=r["shape"], nodes=tuple(s["node"] for s in r["stages"]))
            for r in data["replicas"]
        )
        t = data["totals"]
        return PreviousPlan(plan=data["plan"], replicas=reps, scale=float(t["scale"]),
                            price_per_s=float(t["price_per_hour"]) / 3600.0, churn_penalty=churn_penalty)
    except OSError as exc:
        raise HetcompileError(f"cannot read previous plan {str(path)!r}: {exc.strerror}") from None
    except (ValueError, KeyError, TypeError) as exc:
        raise HetcompileError(f"{str(path)!r} is not a hetcompile plan.json ({exc!r})",
                              hint="pass the plan.json (or the output directory) of an earlier `hetcompile build`") from None
