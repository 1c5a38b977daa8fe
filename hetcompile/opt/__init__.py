"""The optimization layer, neutral to what is optimized: every solver call goes through here.

- `solve.solve`: a Pyomo model in, `SolveResult` (incumbent, bound, gap, time, which limit
  stopped it) out; HiGHS through APPSI, fixed threads and seed. Every pass's MILP/LP uses it.
- `dense.small_lp` / `dense.small_milp`: tiny dense subproblems of heuristics and bounds (pricing,
  integer masters) straight to highspy, silent, one thread, seed 0: the same solver and the same
  reproducibility rules without Pyomo's build cost.
- `budget.WorkBudget`: deterministic work budgets for searches, the wall clock only as a cap.
"""
