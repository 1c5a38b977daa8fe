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
    # verification re-solves with new tail factors; placements that do not depend on them are reused
    with remembering():
        res = run_pipeline(ir, default_pipeline(), ctx, stop_after=stop_after, dump_after=dump_after)
        if res.stopped_after is not None:
            return res
        return verify_by_simulation(ir, res, ctx, log)


def _miss_text(m) -> str:
    """A miss in words: the judged percentile (the upper confidence bound, simulate/verify.py) over its target."""
    if m.simulated_s <= m.target_s:
        return (f"{m.what} {m.percentile} {m.simulated_s:.3g} s within target {m.target_s:.3g} s, but too few requests "
                f"within every target for a {m.percentile}")
    return f"{m.what} {m.percentile} {'unbounded' if m.simulated_s == float('inf') else f'{m.simulated_s:.3g} s'} > target {m.target_s:.3g} s"


def verify_by_simulation(ir0: Problem, res: PipelineResult, ctx: PassContext, log: Callable[[str], None]) -> PipelineResult:
    """DESIGN.md's step 7: replay the plan at its planned load (simulate/verify.py) and search, per
    workload, the share f_w of the tail model's load (`tail_factors`) at which its targets hold (an
    SLO, or without one the queueing bound): a missed workload's f_w shrinks by `tighten`'s step until
    a plan holds, then bisects between the highest f_w that held and the lowest that missed (latency
    is steep in load, so one ratio step overshoots), re-solving each time, for at most MAX_ROUNDS
    plans. The result is the last plan whose every target held. If none held: an SLO missed (or a
    tightened plan that no longer fits) is an error at the SLO's line with what would meet it; only
    queueing bounds missed leave the last plan standing, with `verification.unmet` saying so."""
    from hetcompile.backends.plan_json import plan_doc
    from hetcompile.simulate.verify import MAX_ROUNDS, summary, tighten, verify

    factors: dict[str, float] = {}
    held: dict[str, float] = {}  # per workload, the highest f_w whose targets held
    missed: dict[str, float] = {}  # the lowest f_w whose targets missed
    best: PipelineResult | None = None
    for rounds in range(1, MAX_ROUNDS + 1):
        start = time.perf_counter()
        docs, ws, misses = verify(plan_doc(res.ir))
        if docs is None:
            return res  # nothing to check: no SLO and no queueing bound
        log(f"verify: round {rounds}: {sum(w.arrived for d in docs for w in d.workloads)} requests simulated in "
            f"{time.perf_counter() - start:.3f}s" + ("".join(f"; {m.workload}: {_miss_text(m)}" for m in misses)))
        slo = [m for m in misses if m.kind == "slo"]
        unmet = tuple(sorted({f"{m.workload}: {_miss_text(m)}" for m in misses if m.kind != "slo"}))
        verified = PipelineResult(res.ir.model_copy(update={"verification": summary(docs, ws, rounds, factors, unmet)}),
                                  None, res.dumps)
        if not misses:
            best = verified
        bad = {m.workload for m in misses}
        for w in ws:
            _record(held, missed, w.name, factors.get(w.name, 1.0), w.name in bad)
        trial = _next_factors(factors, held, missed, tighten(misses))
        if trial == factors or rounds == MAX_ROUNDS:
            break
        try:
            res = run_pipeline(ir0.model_copy(update={"tail_factors": tuple(sorted(trial.items()))}), default_pipeline(), ctx)
        except HetcompileError as exc:
            if best is not None or not slo:
                log(f"verify: a plan at {_factors_text(trial)} of the tail model's load does not fit "
                    f"({str(exc).splitlines()[0]})")
                return best or verified
            w = slo[0].workload
            raise InfeasibleError(
                f"the SLO of workload {w!r} is not met at the planned load (simulated: "
                f"{'; '.join(_miss_text(m) for m in slo if m.workload == w)}), and a plan that loads its replicas "
                f"less ({trial.get(w, 1.0):.0%} of the tail model's load) does not fit: {str(exc).splitlines()[0]}",
                ir0.span(f"slo:{w}") or ir0.span("budget"),
                hint=_cheapest_change(slo, w),
            ) from None
        factors = trial
    if best is not None:
        return best
    if not slo:
        return verified
    w = slo[0].workload
    raise InfeasibleError(
        f"the SLO of workload {w!r} is still missed after {MAX_ROUNDS} plan(s), each loading its replicas less "
        f"(now {factors.get(w, 1.0):.0%} of the tail model's load); simulated at the planned load: "
        + "; ".join(_miss_text(m) for m in slo if m.workload == w),
        ir0.span(f"slo:{w}"),
        hint=_cheapest_change(slo, w),
    )


def _record(held: dict[str, float], missed: dict[str, float], w: str, f: float, miss: bool) -> None:
    """Note that workload w's targets missed (or held) at share f. The newest outcome wins over an
    older one it contradicts: workloads share the budget, so another workload's tighter share can
    change what compose buys for this one, and a share that held in an earlier round can miss now
    (chat-rag: rag held at 100% in round 1 and missed at 100% from round 2; with the stale hold
    bracketing it, it was never tightened)."""
    if miss:
        missed[w] = min(missed.get(w, f), f)
        if held.get(w, 0.0) >= f:
            del held[w]
    else:
        held[w] = max(held.get(w, 0.0), f)
        if missed.get(w, 2.0) <= f:
            del missed[w]


BISECT_TOLERANCE = 0.05  # stop refining f_w once the held and missed shares are this close (relative)


def _next_factors(factors: dict[str, float], held: dict[str, float], missed: dict[str, float],
                  steps: dict[str, float]) -> dict[str, float]:
    """The next round's f_w (verify_by_simulation): missed and never held -> f_w x its tighten step;
    bracketed (held at lo, missed at hi) and hi - lo > BISECT_TOLERANCE x hi -> (lo + hi) / 2, the
    midpoint tried next; otherwise the highest share that held."""
    out = dict(factors)
    for w in sorted(set(held) | set(missed)):
        f = factors.get(w, 1.0)
        if w in missed and w not in held:
            out[w] = f * steps.get(w, 1.0) if w in steps else f
            continue
        if w not in missed:
            continue
        lo, hi = held[w], missed[w]
        out[w] = 0.5 * (lo + hi) if hi - lo > BISECT_TOLERANCE * hi else lo
    return {w: round(f, 6) for w, f in out.items() if round(f, 6) < 1.0}


def _factors_text(factors: dict[str, float]) -> str:
    return ", ".join(f"{w} {f:.0%}" for w, f in sorted(factors.items())) or "100%"


def _cheapest_change(misses, w: str) -> str:
    """The loosest targets the last plan meets, and the other ways out."""
    loose = [f"{m.what.lower()}: {m.simulated_s * 1.05:.3g}s" for m in misses if m.workload == w and m.simulated_s < float("inf")]
    return ((f"loosen the target to what the plan reaches ({', '.join(loose)}), " if loose else "") +
            "raise `budget` or offer faster GPUs so that more replicas share the load, or choose a lower `percentile`")
