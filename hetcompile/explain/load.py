"""Read a plan.json (or an OUT directory holding one) for explain/diff, or say plainly why not.

The file is validated as a `PlanDoc` (hetcompile/plan/io.py); explain then reads it as a dict.
"""

from __future__ import annotations

from pathlib import Path

from hetcompile.plan.io import PlanReadError, check_plan_doc, read_plan_doc

__all__ = ["PlanReadError", "check_plan", "read_plan"]


def read_plan(path: Path, what: str = "plan") -> dict:
    """The plan at `path` (a plan.json, or a directory with plan.json in it); `what` names it in errors."""
    return read_plan_doc(path, what).model_dump(mode="json")


def check_plan(data: object, where: str = "plan") -> dict:
    return check_plan_doc(data, where).model_dump(mode="json")
