"""The compiler driver: spec file -> IR -> pass pipeline -> plan IR (what `hetcompile build` runs)."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from hetcompile.ir.lower import load_problem
from hetcompile.plan.io import read_plan_doc
from hetcompile.ir.previous import DEFAULT_CHURN_PENALTY, previous_plan
from hetcompile.ir.observed import apply_observed
from hetcompile.plan.observed import ObservedDoc
from hetcompile.passes import default_pipeline
from hetcompile.passes.base import PassContext, PipelineResult, run_pipeline
from hetcompile.opt.solve import SolverOptions
from hetcompile.placement import remembering


def compile_spec(
    spec_path: Path,
    stop_after: str | None = None,
    dump_after: tuple[str, ...] = (),
    log: Callable[[str], None] = lambda _: None,
    previous: Path | None = None,
    churn_penalty: float = DEFAULT_CHURN_PENALTY,
    status: Callable[[str], None] | None = None,
    on_pass: Callable[[str], None] = lambda _: None,
    verify: bool = True,
    workers: int = 1,
    observed: ObservedDoc | None = None,
) -> PipelineResult:
    """`previous`: an earlier plan.json to replan against (seed 003 App. M): compose charges every
    replica launched or torn down `churn_penalty` x that plan's objective, and kept replicas keep
    their ids and nodes. `verify=False` leaves out pass 7 (the simulation that checks the plan's
    targets and replans until they hold: passes/verify.py). `workers`: processes the verification's
    replications run in (the CLI uses the machine's cores; the results do not depend on it).
    `observed`: an observed.yaml (`hetcompile observe`) whose rates, lengths and step-time
    corrections replace the spec's (ir/observed.py)."""
    ir, _, _ = load_problem(spec_path)
    if observed is not None:  # measured rates, lengths and step-time corrections in place of the spec's guesses
        ir = apply_observed(ir, observed)
    if previous is not None:
        ir = ir.model_copy(update={"previous": previous_plan(read_plan_doc(previous, "previous plan"), churn_penalty)})
    s = ir.solver
    ctx = PassContext(solver=SolverOptions(time_limit_s=s.time_limit_s, mip_gap=s.mip_gap, threads=s.threads, seed=s.seed,
                                           node_limit=s.node_limit, progress=log, status=status),
                      log=log, on_pass=on_pass, options={"verify_workers": workers})
    # verification re-solves with new tail factors; placements that do not depend on them are reused
    with remembering():
        return run_pipeline(ir, default_pipeline(verify, ir.disaggregation), ctx, stop_after=stop_after, dump_after=dump_after)
