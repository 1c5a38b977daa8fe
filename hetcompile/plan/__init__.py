"""The plan document and its files: what `hetcompile build` promises, as typed data.

- `doc`: `PlanDoc`, the contract every reader of plan.json uses (`schemas/plan.schema.json` is
  generated from it and pinned by tests/test_pipeline.py::test_schemas_are_current).
- `io`: read and validate a plan.json, with located errors.
- `canon`: the canonical serializers (sorted keys, 6 significant digits) that make the same spec
  give the same bytes.
- `previous`: a previous plan as the IR replanning reads (`--previous`).
"""
