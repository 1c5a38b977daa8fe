"""Read a plan.json (or an OUT directory holding one) for explain/diff/migrate, or say plainly why not.

The file is validated as a `PlanDoc` (hetcompile/plan/io.py), and explain and migrate read
its typed fields.
"""

from __future__ import annotations

from pathlib import Path

from hetcompile.plan.doc import PlanDoc
from hetcompile.plan.io import PlanReadError, check_plan_doc, read_plan_doc

__all__ = ["PlanReadError", "check_plan", "read_plan"]


def read_plan(path: Path, what: str = "plan") -> PlanDoc:
    """The plan at `path` (a plan.json, or a directory with plan.json in it); `what` names it in errors."""
    return read_plan_doc(path, what)


def check_plan(data: object, where: str = "plan") -> PlanDoc:
    """`data` (plan.json as parsed JSON) as a PlanDoc, or a PlanReadError naming what is wrong."""
    return check_plan_doc(data, where)
