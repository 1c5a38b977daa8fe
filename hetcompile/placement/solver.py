"""Solver helpers local to placement, under the conventions of `hetcompile.passes.solve`.

- `solve_warm`: the shared `solve` plus a MIP start (APPSI's `warmstart`, which passes the
  Pyomo variables' current values to HiGHS `setSolution`). The shared wrapper has no such
  switch yet; this mirrors it line for line otherwise (same SolveResult, same status rules).
- `small_milp` / `small_lp`: tiny dense problems (pricing, integer masters) straight to
  highspy, silent, single-threaded; they are subroutines of heuristics and bounds, not models
  of the pass, so they skip Pyomo's build cost.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import highspy
import numpy as np
import pyomo.environ as pyo
from pyomo.contrib.appsi.base import TerminationCondition
from pyomo.contrib.appsi.solvers import Highs

from hetcompile.ir.errors import SolverError
from hetcompile.passes.solve import SolveResult, SolverOptions, Status, relative_gap


def solve_warm(model: pyo.ConcreteModel, options: SolverOptions, *, name: str, warm: bool) -> SolveResult:
    """`hetcompile.passes.solve.solve` with an optional MIP start from the variables' values."""
    objs = list(model.component_data_objects(pyo.Objective, active=True))
    if len(objs) != 1:
        raise SolverError(f"model must have exactly one active objective, found {len(objs)}")
    sense = "max" if objs[0].sense == pyo.maximize else "min"
    solver = Highs()
    if not solver.available():
        raise SolverError("HiGHS is not available: install highspy (`pip install highspy`)")
    solver.config.time_limit = max(float(options.time_limit_s), 0.01)
    solver.config.mip_gap = float(options.mip_gap)
    solver.config.stream_solver = False
    solver.config.load_solution = False
    solver.config.warmstart = bool(warm)
    solver.highs_options = {"threads": int(options.threads), "random_seed": int(options.seed)}
    start = time.perf_counter()
    try:
        res = solver.solve(model)
    except Exception as exc:  # HiGHS/Pyomo internals: report as a solver error with the pass name
        raise SolverError(f"{name}: HiGHS failed: {exc}") from exc
    elapsed = time.perf_counter() - start
    tc = res.termination_condition
    objective = res.best_feasible_objective
    bound = res.best_objective_bound
    if objective is not None and not math.isfinite(objective):
        objective = None
    if tc == TerminationCondition.infeasible or tc == TerminationCondition.infeasibleOrUnbounded:
        status: Status = "infeasible"
    elif tc == TerminationCondition.unbounded:
        status = "unbounded"
    elif objective is None:
        status = "no-solution"
    elif tc == TerminationCondition.optimal:
        status = "optimal"
    else:
        status = "feasible"
    if status in ("optimal", "feasible"):
        res.solution_loader.load_vars()
    if bound is not None and not math.isfinite(bound):
        bound = None
    return SolveResult(name=name, status=status, objective=objective, bound=bound, gap=relative_gap(objective, bound),
                       time_s=elapsed, sense=sense)


@dataclass(frozen=True)
class SmallResult:
    x: np.ndarray | None
    objective: float | None
    optimal: bool
    duals: np.ndarray | None = None  # row duals (LP only)


def _highs(time_limit_s: float) -> highspy.Highs:
    h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    h.setOptionValue("threads", 1)
    h.setOptionValue("random_seed", 0)
    h.setOptionValue("time_limit", max(time_limit_s, 0.01))
    return h


def small_milp(
    c: np.ndarray, A: np.ndarray, row_lo: np.ndarray, row_hi: np.ndarray, col_lo: np.ndarray, col_hi: np.ndarray,
    integer: np.ndarray, *, maximize: bool = False, time_limit_s: float = 10.0, gap: float = 1e-9,
) -> SmallResult:
    """min (or max) c x s.t. row_lo <= A x <= row_hi, col bounds, integrality mask."""
    h = _highs(time_limit_s)
    h.setOptionValue("mip_rel_gap", gap)
    n = len(c)
    inf = highspy.kHighsInf
    h.addVars(n, np.where(np.isfinite(col_lo), col_lo, -inf).astype(float), np.where(np.isfinite(col_hi), col_hi, inf).astype(float))
    h.changeColsCost(n, np.arange(n, dtype=np.int32), np.asarray(c, dtype=float))
    if integer.any():
        kinds = np.array([highspy.HighsVarType.kInteger if b else highspy.HighsVarType.kContinuous for b in integer])
        h.changeColsIntegrality(n, np.arange(n, dtype=np.int32), kinds)
    if maximize:
        h.changeObjectiveSense(highspy.ObjSense.kMaximize)
    A = np.asarray(A, dtype=float)
    for i in range(A.shape[0]):
        nz = np.nonzero(A[i])[0].astype(np.int32)
        lo = row_lo[i] if np.isfinite(row_lo[i]) else -inf
        hi = row_hi[i] if np.isfinite(row_hi[i]) else inf
        h.addRow(float(lo), float(hi), len(nz), nz, A[i, nz])
    h.run()
    st = h.getModelStatus()
    info = h.getInfo()
    if info.primal_solution_status != 2:  # kSolutionStatusFeasible
        return SmallResult(None, None, False)
    x = np.array(h.getSolution().col_value)
    duals = np.array(h.getSolution().row_dual) if not integer.any() else None
    return SmallResult(x, float(info.objective_function_value), st == highspy.HighsModelStatus.kOptimal, duals)
