"""The plan document and its files: what `hetcompile build` promises, as typed data.

- `doc`: `PlanDoc`, the contract every reader of plan.json uses (`schemas/plan.schema.json` is
  generated from it and pinned by tests/test_pipeline.py::test_schemas_are_current).
- `io`: read and validate a plan.json, with located errors.
- `canon`: the canonical serializers (sorted keys, 6 significant digits) that make the same spec
  give the same bytes.

The document declares its own types, the records passes report into it included (`Binding`,
`ModelPlacement`, `PrimaryWorkers`, ...): the problem IR (ir/problem.py) carries those, not the
other way round, so no internal IR change can reach the public schema unseen. doc.py imports only
`names` (identifier rules), `frozen` and `perf.stepmodel`: the step model is part of the contract
(the simulator replays it from plan.json), and the schema test pins all of it.
"""
