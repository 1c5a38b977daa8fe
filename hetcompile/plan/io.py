"""Read a plan.json (or an OUT directory holding one) as a `PlanDoc`, or say plainly why not."""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import ValidationError

from hetcompile.errors import HetcompileError
from hetcompile.plan.doc import PLAN_FORMAT, PlanDoc


class PlanReadError(HetcompileError):
    """The file is missing, unreadable, not JSON, or not a hetcompile plan.json."""

    kind = "plan error"


def _where(loc: tuple) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(top level)"


def check_plan_doc(data: object, where: str = "plan") -> PlanDoc:
    """`data` as a PlanDoc, or a PlanReadError naming the first field that is wrong."""
    if not isinstance(data, dict):
        raise PlanReadError(f"{where} is not a hetcompile plan.json: expected an object, found {type(data).__name__}")
    if "format" not in data:
        hint = ("schemas/routing.schema.json describes router/routing.json; explain wants OUT/plan.json"
                if "models" in data and "replicas" in data and "totals" not in data else
                "rebuild it with this hetcompile (`hetcompile build SPEC -o OUT`): plans without `format` "
                "come from before the plan document was typed")
        raise PlanReadError(f"{where} is not a hetcompile plan.json: no `format: {PLAN_FORMAT}` key", hint=hint)
    if data["format"] != PLAN_FORMAT:
        raise PlanReadError(f"{where} has format {data['format']!r}; this hetcompile reads {PLAN_FORMAT!r}")
    try:
        return PlanDoc.model_validate(data)
    except ValidationError as exc:
        errs = exc.errors()
        first = errs[0]
        more = f" (and {len(errs) - 1} more)" if len(errs) > 1 else ""
        raise PlanReadError(f"{where}: {_where(first['loc'])}: {first['msg']}{more}",
                            hint="plan.json is written by `hetcompile build`; schemas/plan.schema.json describes it") from None


def read_plan_doc(path: Path, what: str = "plan") -> PlanDoc:
    """The PlanDoc at `path` (a plan.json, or a directory with plan.json in it); `what` names it in errors."""
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
    return check_plan_doc(data, str(file))
