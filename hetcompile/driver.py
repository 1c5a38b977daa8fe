"""The compiler driver: spec file -> IR -> pass pipeline -> plan IR (what `hetcompile build` runs)."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from hetcompile.ir.lower import load_problem
from hetcompile.ir.plan_io import read_plan_doc
from hetcompile.ir.previous import DEFAULT_CHURN_PENALTY, previous_plan
from hetcompile.passes import default_pipeline
from hetcompile.passes.base import PassContext, PipelineResult, run_pipeline
from hetcompile.passes.progress import ProgressLine
from hetcompile.passes.solve import SolverOptions


def compile_spec(
    spec_path: Path,
    stop_after: str | None = None,
    dump_after: tuple[str, ...] = (),
    log: Callable[[str], None] = lambda _: None,
    previous: Path | None = None,
    churn_penalty: float = DEFAULT_CHURN_PENALTY,
    progress: ProgressLine | None = None,
) -> PipelineResult:
    """`previous`: an earlier plan.json to replan against (seed 003 App. M): compose charges every
    replica launched or torn down `churn_penalty` x that plan's objective, and kept replicas keep
    their ids and nodes. `progress`: the live stderr line of long passes (display only)."""
    ir, _, _ = load_problem(spec_path)
    if previous is not None:
        ir = ir.model_copy(update={"previous": previous_plan(read_plan_doc(previous, "previous plan"), churn_penalty)})
    s = ir.solver
    ctx = PassContext(solver=SolverOptions(time_limit_s=s.time_limit_s, mip_gap=s.mip_gap, threads=s.threads, seed=s.seed,
                                           node_limit=s.node_limit,
                                           # on a terminal the live line shows solver progress; else one log line each
                                           progress=progress.update if progress is not None and progress.enabled else log),
                      log=log, progress=progress)
    return run_pipeline(ir, default_pipeline(), ctx, stop_after=stop_after, dump_after=dump_after)
