"""The compiler driver: spec file -> IR -> pass pipeline -> plan IR (what `hetcompile build` runs)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Callable

from hetcompile.errors import HetcompileError, InfeasibleError
from hetcompile.ir.problem import Problem
from hetcompile.ir.lower import load_problem
from hetcompile.plan.io import read_plan_doc
from hetcompile.ir.previous import DEFAULT_CHURN_PENALTY, previous_plan
from hetcompile.passes import default_pipeline
from hetcompile.passes.base import PassContext, PipelineResult, run_pipeline
from hetcompile.opt.solve import SolverOptions


def compile_spec(
    spec_path: Path,
    stop_after: str | None = None,
    dump_after: tuple[str, ...] = (),
    log: Callable[[str], None] = lambda _: None,
    previous: Path | None = None,
    churn_penalty: float = DEFAULT_CHURN_PENALTY,
    status: Callable[[str], None] | None = None,
    on_pass: Callable[[str], None] = lambda _: None,
) -> PipelineResult:
    """`previous`: an earlier plan.json to replan against (seed 003 App. M): compose charges every
    replica launched or torn down `churn_penalty` x that plan's objective, and kept replicas keep
    their ids and nodes."""
    ir, _, _ = load_problem(spec_path)
    if previous is not None:
        ir = ir.model_copy(update={"previous": previous_plan(read_plan_doc(previous, "previous plan"), churn_penalty)})
    s = ir.solver
    ctx = PassContext(solver=SolverOptions(time_limit_s=s.time_limit_s, mip_gap=s.mip_gap, threads=s.threads, seed=s.seed,
                                           node_limit=s.node_limit, progress=log, status=status),
                      log=log, on_pass=on_pass)
    res = run_pipeline(ir, default_pipeline(), ctx, stop_after=stop_after, dump_after=dump_after)
    if res.stopped_after is not None:
        return res
    return verify_by_simulation(ir, res, ctx, log)


def _miss_text(m) -> str:
    return f"{m.what} {m.percentile} {'unbounded' if m.simulated_s == float('inf') else f'{m.simulated_s:.3g} s'} > target {m.target_s:.3g} s"


def verify_by_simulation(ir0: Problem, res: PipelineResult, ctx: PassContext, log: Callable[[str], None]) -> PipelineResult:
    """DESIGN.md's step 7: replay the plan at its planned load (simulate/verify.py); where an SLO
    misses, keep a smaller share of the tail model's load for that workload (`tail_factors`) and
    re-solve, for at most MAX_ROUNDS plans. An SLO still missed, or a tightened plan that no longer
    fits the budget, is an error at the SLO's line with what would meet it."""
    from hetcompile.backends.plan_json import plan_doc
    from hetcompile.simulate.verify import MAX_ROUNDS, summary, tighten, verify

    factors: dict[str, float] = {}
    last_sim: dict[str, float] = {}
    for rounds in range(1, MAX_ROUNDS + 1):
        start = time.perf_counter()
        doc, ws, misses = verify(plan_doc(res.ir))
        if doc is None:
            return res  # no SLO: the headroom alone, nothing to verify
        log(f"verify: round {rounds}: {sum(w.arrived for w in doc.workloads)} requests simulated in "
            f"{time.perf_counter() - start:.3f}s" + ("".join(f"; {m.workload}: {_miss_text(m)}" for m in misses)))
        if not misses:
            return PipelineResult(res.ir.model_copy(update={"verification": summary(doc, ws, rounds, factors)}), None, res.dumps)
        for m in misses:
            last_sim[f"{m.workload}:{m.what}"] = m.simulated_s
        if rounds == MAX_ROUNDS:
            break
        for w, step in tighten(misses).items():
            factors[w] = factors.get(w, 1.0) * step
        tightened = ir0.model_copy(update={"tail_factors": tuple(sorted(factors.items()))})
        try:
            res = run_pipeline(tightened, default_pipeline(), ctx)
        except HetcompileError as exc:
            w = misses[0].workload
            raise InfeasibleError(
                f"the SLO of workload {w!r} is not met at the planned load (simulated: "
                f"{'; '.join(_miss_text(m) for m in misses if m.workload == w)}), and a plan that loads its replicas "
                f"less ({factors[w]:.0%} of the tail model's load) does not fit: {str(exc).splitlines()[0]}",
                ir0.span(f"slo:{w}") or ir0.span("budget"),
                hint=_cheapest_change(misses, w),
            ) from None
    w = misses[0].workload
    raise InfeasibleError(
        f"the SLO of workload {w!r} is still missed after {MAX_ROUNDS} plan(s), each loading its replicas less "
        f"(now {factors.get(w, 1.0):.0%} of the tail model's load); simulated at the planned load: "
        + "; ".join(_miss_text(m) for m in misses if m.workload == w),
        ir0.span(f"slo:{w}"),
        hint=_cheapest_change(misses, w),
    )


def _cheapest_change(misses, w: str) -> str:
    """The loosest targets the last plan meets, and the other ways out."""
    loose = [f"{m.what.lower()}: {m.simulated_s * 1.05:.3g}s" for m in misses if m.workload == w and m.simulated_s < float("inf")]
    return ((f"loosen the target to what the plan reaches ({', '.join(loose)}), " if loose else "") +
            "raise `budget` or offer faster GPUs so that more replicas share the load, or choose a lower `percentile`")
