"""Small dense solves for placement's heuristics and bounds (the pass's own models go through
`hetcompile.opt.solve.solve`, with `warm_start=True` for a MIP start).

- `small_milp` / `small_lp`: tiny dense problems (pricing, integer masters) straight to
  highspy, silent, single-threaded; they are subroutines of heuristics and bounds, not models
  of the pass, so they skip Pyomo's build cost.
"""

from __future__ import annotations

from dataclasses import dataclass

import highspy
import numpy as np


@dataclass(frozen=True)
class SmallResult:
    x: np.ndarray | None
    objective: float | None
    optimal: bool
    duals: np.ndarray | None = None  # row duals (LP only)
    timed_out: bool = False  # the wall-clock cap, not optimality or the node limit, ended the solve


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
    node_limit: int | None = None,
) -> SmallResult:
    """min (or max) c x s.t. row_lo <= A x <= row_hi, col bounds, integrality mask.

    `node_limit` (HiGHS mip_max_nodes) is the deterministic stop; the time limit is only a cap.
    """
    h = _highs(time_limit_s)
    h.setOptionValue("mip_rel_gap", gap)
    if node_limit is not None:
        h.setOptionValue("mip_max_nodes", int(node_limit))
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
    timed_out = st == highspy.HighsModelStatus.kTimeLimit
    if info.primal_solution_status != 2:  # kSolutionStatusFeasible
        return SmallResult(None, None, False, timed_out=timed_out)
    x = np.array(h.getSolution().col_value)
    duals = np.array(h.getSolution().row_dual) if not integer.any() else None
    return SmallResult(x, float(info.objective_function_value), st == highspy.HighsModelStatus.kOptimal, duals,
                       timed_out=timed_out)


def small_lp(c: np.ndarray, A_ub: np.ndarray, b_ub: np.ndarray, col_hi: np.ndarray | float = np.inf, *,
             time_limit_s: float = 10.0) -> SmallResult:
    """max c x s.t. A_ub x <= b_ub, 0 <= x <= col_hi: the LP form placement's bounds and pricing use.

    `duals` are the prices pi >= 0 of the rows (d objective / d b_ub), what column generation
    prices patterns with. Solved as min -c x, whose HiGHS row duals are <= 0 on binding rows.
    """
    c = np.asarray(c, dtype=float)
    n = len(c)
    A = np.asarray(A_ub, dtype=float).reshape(-1, n)
    b = np.asarray(b_ub, dtype=float)
    hi = np.broadcast_to(np.asarray(col_hi, dtype=float), (n,))
    res = small_milp(-c, A, np.full(len(b), -np.inf), b, np.zeros(n), hi, np.zeros(n, dtype=bool), time_limit_s=time_limit_s)
    if res.x is None or res.objective is None:  # both or neither
        return res
    return SmallResult(res.x, -res.objective, res.optimal, None if res.duals is None else -res.duals, res.timed_out)
