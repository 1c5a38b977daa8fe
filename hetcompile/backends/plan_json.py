"""plan.json and timings.json: the plan document (ir/document.py) as canonical JSON types."""

from __future__ import annotations

from hetcompile.ir.document import plan_doc
from hetcompile.ir.problem import Problem


def plan_dict(ir: Problem) -> dict:
    """plan.json's content (JSON types, not yet rounded: dumps_json rounds)."""
    out = plan_doc(ir).model_dump(mode="json")
    if out.get("primary_workers") is None:
        out.pop("primary_workers", None)  # plans selection did not change keep their bytes
    for key in ("what_it_would_take", "alternatives"):
        if out.get(key) is None:
            out.pop(key, None)  # plans without them keep their bytes
    return out


def timings_dict(ir: Problem) -> dict:
    return {"passes": [{"name": p.name, "time_s": round(p.time_s, 4)} for p in ir.reports]}
