"""The one place hetcompile calls a solver: Pyomo model in, `SolveResult` out.

Every optimization pass builds a Pyomo model with its own `build_model`, then calls `solve`.
The wrapper fixes what makes runs reproducible (thread count, random seed), applies the time
limit and relative MIP gap from the spec, and always reports incumbent, bound, gap and wall
time -- also when time runs out, so a pass can state an honest gap instead of a silent bad plan.
It never asserts on solver status: the caller decides what infeasibility means and raises a
typed error that names the binding constraint.

Two budgets stop a MILP early. `node_limit` (branch-and-bound nodes) is work, so a plan stopped
by it is the same on every machine; `time_limit_s` is a wall-clock cap that keeps a build from
running away, and `SolveResult.limit == "time"` tells the caller its plan may depend on the
machine's speed (the passes say so in their notes).

HiGHS (via highspy) is driven through Pyomo's APPSI interface, which exposes the incumbent
and the dual bound after a time-limited MIP solve. `warm_start=True` hands the variables' current
values to HiGHS as a MIP start (APPSI's `warmstart`, HiGHS `setSolution`): a pass that already
holds a good heuristic solution never ends a time-limited solve with less than it.
"""

from __future__ import annotations

import math
import time
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal, TextIO

import pyomo.core as pyo
from pyomo.contrib.appsi.base import TerminationCondition
from pyomo.contrib.appsi.solvers import Highs

from hetcompile.errors import SolverError

Status = Literal["optimal", "feasible", "infeasible", "no-solution", "unbounded"]
PROGRESS_EVERY_S = 5.0
STATUS_EVERY_S = 1.0


@dataclass(frozen=True)
class SolverOptions:
    """Solver settings; the spec's `solver:` block maps onto these."""

    time_limit_s: float = 60.0
    mip_gap: float = 1e-4
    threads: int = 1
    seed: int = 0
    node_limit: int | None = None  # branch-and-bound nodes per MILP: a work budget, the same on every machine
    # HiGHS's root restart (mip_allow_restart): after fixing the columns the root found inactive, it
    # solves the root again, sub-MIP heuristics included. Worth it for a search that goes on; a
    # re-solve held to a few nodes spends its budget there (compose's what-if and alternatives)
    restarts: bool = True
    # HiGHS's sub-MIP heuristics (RINS, RENS: a smaller MIP solved around the LP solution). Held to
    # a few nodes, a re-solve that starts from a known plan spends most of its time in them for
    # nothing (scale1072's max-theta at 50 nodes: 2.1 of 2.5 s in 41 sub-MIPs, the same incumbent
    # and bound without them in 0.4 s, the root's reduced-cost heuristic finding it)
    submips: bool = True
    # display only, never changes a result: `progress(line)` hears about long MIP solves every
    # PROGRESS_EVERY_S (a log line); `status(line)` every STATUS_EVERY_S and at each step of a
    # search, what a live status line shows (incumbent, bound, gap), replaced by the next one
    progress: Callable[[str], None] | None = field(default=None, compare=False, repr=False)
    status: Callable[[str], None] | None = field(default=None, compare=False, repr=False)

    def tell(self, line: str) -> None:
        """A status line for the live display, when there is one."""
        if self.status is not None:
            self.status(line)


@dataclass(frozen=True)
class SolveResult:
    """What a solve produced. `objective` is the incumbent (None without one)."""

    name: str
    status: Status
    objective: float | None
    bound: float | None
    gap: float | None
    time_s: float
    sense: Literal["min", "max"]
    limit: Literal["time", "nodes"] | None = None  # which budget stopped the solve before it proved optimality

    @property
    def machine_dependent(self) -> bool:
        """Stopped by the wall clock: another machine could have returned another plan."""
        return self.limit == "time"

    @property
    def has_solution(self) -> bool:
        return self.status in ("optimal", "feasible")


def relative_gap(objective: float | None, bound: float | None) -> float | None:
    """|bound - incumbent| / max(|incumbent|, 1e-9): HiGHS's own definition of the MIP gap."""
    if objective is None or bound is None or not math.isfinite(bound):
        return None
    return abs(bound - objective) / max(abs(objective), 1e-9)


def _sense(model: pyo.ConcreteModel) -> Literal["min", "max"]:
    objs = list(model.component_data_objects(pyo.Objective, active=True))
    if len(objs) != 1:
        raise SolverError(f"model must have exactly one active objective, found {len(objs)}")
    return "max" if objs[0].sense == pyo.maximize else "min"


def _report_progress(highs, options: SolverOptions, name: str) -> Callable[[], None]:
    """During a MIP solve, one line (time, nodes, incumbent, bound, gap) to `options.status` every
    STATUS_EVERY_S and to `options.progress` every PROGRESS_EVERY_S.

    APPSI captures file descriptors 1 and 2 (and swaps sys.stderr) while HiGHS runs, so the line
    is written with sys.stderr pointed at a duplicate of the real stderr taken before the solve;
    a stderr with no file descriptor (a test runner's buffer) is used as it is. Returns the
    function that closes the duplicate after the solve."""
    real: TextIO
    try:
        real = os.fdopen(os.dup(sys.stderr.fileno()), "w", buffering=1)
        close = real.close
    except (AttributeError, OSError, ValueError):  # io.UnsupportedOperation is both OSError and ValueError
        real, close = sys.stderr, (lambda: None)
    last = {"status": 0.0, "progress": 0.0}
    every = {"status": STATUS_EVERY_S, "progress": PROGRESS_EVERY_S}
    sinks = {k: f for k, f in (("status", options.status), ("progress", options.progress)) if f is not None}

    def on_interrupt(event) -> None:
        out = event.data_out
        due = [k for k in sinks if out.running_time - last[k] >= every[k]]
        if not due:
            return
        for k in due:
            last[k] = out.running_time
        has = abs(out.mip_primal_bound) < 1e30
        gap = relative_gap(out.mip_primal_bound, out.mip_dual_bound) if has else None
        line = f"{name}: {out.running_time:.0f} s, {out.mip_node_count} nodes, " + (
            "no incumbent yet" if gap is None else
            f"incumbent {out.mip_primal_bound:.6g}, bound {out.mip_dual_bound:.6g}, gap {100 * gap:.3g}%")
        saved, sys.stderr = sys.stderr, real
        try:
            for k in due:
                sinks[k](line)
        finally:
            sys.stderr = saved

    highs.cbMipInterrupt.subscribe(on_interrupt)
    return close


def solve(model: pyo.ConcreteModel, options: SolverOptions, *, name: str, warm_start: bool = False) -> SolveResult:
    """Solve `model` with HiGHS; load the incumbent into the model's variables when there is one."""
    sense = _sense(model)
    solver = Highs()
    if not solver.available():
        raise SolverError("HiGHS is not available: install highspy (`pip install highspy`)")
    solver.config.time_limit = max(float(options.time_limit_s), 0.01)
    solver.config.mip_gap = float(options.mip_gap)
    solver.config.stream_solver = False
    solver.config.load_solution = False
    solver.config.warmstart = bool(warm_start)
    solver.highs_options = {"threads": int(options.threads), "random_seed": int(options.seed)}
    if options.node_limit is not None:
        solver.highs_options["mip_max_nodes"] = int(options.node_limit)
    if not options.restarts:
        solver.highs_options["mip_allow_restart"] = False
    if not options.submips:
        solver.highs_options["mip_heuristic_run_rins"] = False
        solver.highs_options["mip_heuristic_run_rens"] = False
    start = time.perf_counter()
    close = None
    try:
        if options.progress is not None or options.status is not None:
            solver.set_instance(model)  # creates the highspy model now, so the callback can be attached
            close = _report_progress(solver._solver_model, options, name)
        res = solver.solve(model)
    except Exception as exc:  # HiGHS/Pyomo internals: report as a solver error with the pass name
        raise SolverError(f"{name}: HiGHS failed: {exc}") from exc
    finally:
        if close is not None:
            close()
    elapsed = time.perf_counter() - start

    tc = res.termination_condition
    objective = res.best_feasible_objective
    bound = res.best_objective_bound
    if objective is not None and not math.isfinite(objective):
        objective = None
    if tc == TerminationCondition.infeasible:
        status: Status = "infeasible"
    elif tc == TerminationCondition.unbounded:
        status = "unbounded"
    elif tc == TerminationCondition.infeasibleOrUnbounded:
        status = "infeasible"
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
    limits: dict[TerminationCondition, Literal["time", "nodes"]] = {
        TerminationCondition.maxTimeLimit: "time", TerminationCondition.maxIterations: "nodes",
    }
    limit = limits.get(tc)
    return SolveResult(
        name=name,
        status=status,
        objective=objective,
        bound=bound,
        gap=relative_gap(objective, bound),
        time_s=elapsed,
        sense=sense,
        limit=limit if status != "optimal" else None,
    )
