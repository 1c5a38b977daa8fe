"""Read a plan.json (or an OUT directory holding one) for explain/diff, or say plainly why not.

Only the keys explain needs are checked; unknown keys (a `placement` block a later compiler adds)
pass through untouched, so an older explain reads a newer plan.
"""

from __future__ import annotations

import json
from pathlib import Path

from hetcompile.ir.errors import HetcompileError

REQUIRED = ("plan", "replicas", "routing", "totals", "workloads", "nodes")


class PlanReadError(HetcompileError):
    """The file is missing, unreadable, not JSON, or not a hetcompile plan.json."""

    kind = "plan error"


def read_plan(path: Path, what: str = "plan") -> dict:
    """The plan dict at `path` (a plan.json, or a directory with plan.json in it); `what` names it in errors."""
    path = Path(path)
    file = path / "plan.json" if path.is_dir() else path
    try:
        text = file.read_text()
    except OSError as exc:
        hint = "pass OUT/plan.json or the OUT directory of `hetcompile build`"
        raise PlanReadError(f"cannot read {what} {str(file)!r}: {exc.strerror or exc}", hint=hint) from None
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise PlanReadError(f"{file} is not JSON: {exc}") from None
    return check_plan(data, str(file))


def check_plan(data: object, where: str = "plan") -> dict:
    """`data` if it looks like a plan.json (the keys explain reads), else a PlanReadError."""
    if not isinstance(data, dict):
        raise PlanReadError(f"{where} is not a plan.json: expected an object, found {type(data).__name__}")
    missing = [k for k in REQUIRED if k not in data]
    if missing:
        hint = "schemas/routing.schema.json describes router/routing.json; explain wants OUT/plan.json" if "models" in data and "replicas" in data else None
        raise PlanReadError(f"{where} is not a hetcompile plan.json: missing {', '.join(missing)}", hint=hint)
    for r in data["replicas"]:
        if not isinstance(r, dict) or not {"id", "model", "stages", "workloads"} <= set(r):
            raise PlanReadError(f"{where}: a replica lacks id, model, stages or workloads")
    return data
