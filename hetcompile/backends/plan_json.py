"""plan.json and timings.json: the plan document (ir/document.py) as canonical JSON types."""

from __future__ import annotations

from hetcompile.ir.document import plan_doc
from hetcompile.ir.problem import Problem


# optional sections a plan leaves out when it has none, so plans without them keep their bytes
OMITTED_WHEN_NONE = ("primary_workers", "what_it_would_take", "alternatives", "observed", "groups", "aggregated")


def plan_dict(ir: Problem) -> dict:
    """plan.json's content (JSON types, not yet rounded: dumps_json rounds)."""
    doc = plan_doc(ir)
    return doc.model_dump(mode="json", exclude={k for k in OMITTED_WHEN_NONE if getattr(doc, k) is None})


def timings_dict(ir: Problem) -> dict:
    return {"passes": [{"name": p.name, "time_s": round(p.time_s, 4)} for p in ir.reports]}
