"""Generate `schemas/*.json` from the pydantic models (kept current by a test)."""

from __future__ import annotations

from hetcompile.plan.canon import dumps_json
from hetcompile.explain.model import json_schema as explain_schema
from hetcompile.plan.doc import PlanDoc
from hetcompile.plan.observed import ObservedDoc
from hetcompile.plan.routing import RoutingTable
from hetcompile.ir.spec import Spec
from hetcompile.simulate.doc import SimulationDoc


def schemas() -> dict[str, str]:
    spec = Spec.model_json_schema()
    spec["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    spec["title"] = "hetcompile spec"
    routing = RoutingTable.model_json_schema()
    routing["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    routing["title"] = "hetcompile routing table"
    plan = PlanDoc.model_json_schema()
    plan["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    plan["title"] = "hetcompile plan (OUT/plan.json)"
    sim = SimulationDoc.model_json_schema()
    sim["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    sim["title"] = "hetcompile simulation (OUT/simulation.json)"
    observed = ObservedDoc.model_json_schema()
    observed["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    observed["title"] = "hetcompile observation (OUT/observed.yaml, `hetcompile observe`)"
    return {
        "observed.schema.json": dumps_json(observed),
        "simulation.schema.json": dumps_json(sim),
        "plan.schema.json": dumps_json(plan),
        "spec.schema.json": dumps_json(spec),
        "routing.schema.json": dumps_json(routing),
        "explain.schema.json": dumps_json(explain_schema()),  # `hetcompile explain --format json`, both kinds
    }
