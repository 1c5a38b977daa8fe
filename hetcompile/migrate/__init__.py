"""Diff -> ordered steps -> executor, shared by `hetcompile deploy` and `hetcompile migrate`.

planner.py   the capacity-safe step order between two plans (launch, route, drain, tear down)
actions.py   those steps as actions on real clusters: the `sky` argv, the routing table to push
diff.py      deploy's desired state (plan + content hashes) against its record and `sky status`
deploy.py    deploy's reconcile: the record's fleet -> OUT's plan, as one Rollout; teardown
run.py       the one executor: runs a Rollout's actions in order, with a journal to resume

One direction only (pyproject.toml's layers): migrate reads explain (its matching, rates and the
Migration record that explain.json carries), explain never imports migrate; planner.plan_diff
plans the migration and hands it to explain.diff_plans. Imports nothing itself, so that loading one
module does not load the executor.
"""
