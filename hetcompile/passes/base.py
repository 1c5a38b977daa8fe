"""Pass infrastructure: the `Pass` contract, the registry, and the manager that runs a pipeline.

A pass has a kebab-case `name`, declares the IR fields it `requires` and the one it `provides`,
and `run(ir, ctx) -> ir` returns a new frozen IR (TVM / xDSL style). The manager runs the fixed
pipeline, checks requirements before and verifies invariants after each pass, records wall time
in the pass's `PassReport`, and can stop or dump after a named pass. A pass that checks the plan
and replans (verify) asks the manager to re-run the passes before it on the pipeline's input with
some fields changed (`ctx.replan(update)`), quietly: the replan's passes log nothing.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Callable, ClassVar

from hetcompile.errors import HetcompileError, PassError
from hetcompile.ir.problem import PassReport, Problem
from hetcompile.opt.solve import SolverOptions


@dataclass
class PassContext:
    """What passes may read besides the IR: solver options and where diagnostics go."""

    solver: SolverOptions
    log: Callable[[str], None] = lambda msg: None
    options: dict = field(default_factory=dict)
    # told each pass's name as it starts ("" when the pipeline ends): the CLI's live status line
    on_pass: Callable[[str], None] = lambda name: None
    # set by the manager for the pass it runs: the passes before it, re-run on the pipeline's input
    # with `update` applied (pydantic model_copy), and the IR they return
    replan: Callable[[dict], Problem] = field(default=lambda update: _no_replan())


def _no_replan() -> Problem:
    raise PassError("replan is only available to a pass the pass manager runs")


class Pass:
    name: ClassVar[str]
    requires: ClassVar[tuple[str, ...]] = ()
    provides: ClassVar[str] = ""

    def run(self, ir: Problem, ctx: PassContext) -> Problem:  # pragma: no cover - interface
        raise NotImplementedError

    def verify(self, ir: Problem) -> None:
        """Invariants of what this pass provides; raise PassError when broken."""


def add_report(ir: Problem, report: PassReport) -> Problem:
    return ir.model_copy(update={"reports": (*ir.reports, report)})


def _replan(source: Problem, upstream: tuple[Pass, ...], quiet: PassContext) -> Callable[[dict], Problem]:
    """A pass's ctx.replan: the passes before it re-run, quietly, on the pipeline's input with `update`."""
    return lambda update: run_pipeline(source.model_copy(update=update), upstream, quiet).ir


@dataclass
class PipelineResult:
    ir: Problem
    stopped_after: str | None
    dumps: dict[str, Problem]


def run_pipeline(
    ir: Problem,
    passes: tuple[Pass, ...],
    ctx: PassContext,
    stop_after: str | None = None,
    dump_after: tuple[str, ...] = (),
) -> PipelineResult:
    names = [p.name for p in passes]
    for n in (stop_after, *dump_after):
        if n is not None and n not in names:
            raise PassError(f"unknown pass {n!r}; the pipeline is {' -> '.join(names)}")
    dumps: dict[str, Problem] = {}
    ran: list[str] = []
    source = ir
    quiet = replace(ctx, log=lambda msg: None, on_pass=lambda name: None, solver=replace(ctx.solver, progress=None))
    for i, p in enumerate(passes):
        pctx = replace(ctx, replan=_replan(source, passes[:i], quiet))
        for req in p.requires:
            if getattr(ir, req) is None:
                raise PassError(f"pass {p.name} needs `{req}`, which no earlier pass provided (ran: {', '.join(ran) or 'none'})")
        start = time.perf_counter()
        n_reports = len(ir.reports)
        ctx.on_pass(p.name)
        try:
            ir = p.run(ir, pctx)
        except HetcompileError:
            raise
        except Exception as exc:  # a bug: name the pass and what ran before it
            raise PassError(f"pass {p.name} crashed after {', '.join(ran) or 'no passes'}: {exc!r}") from exc
        elapsed = time.perf_counter() - start
        if len(ir.reports) == n_reports:
            ir = add_report(ir, PassReport(name=p.name, status="ok", time_s=elapsed))
        else:  # the pass wrote its own report; stamp the full pass time on it
            last = ir.reports[-1]
            ir = ir.model_copy(update={"reports": (*ir.reports[:-1], last.model_copy(update={"time_s": elapsed}))})
        if p.provides and getattr(ir, p.provides) is None:
            raise PassError(f"pass {p.name} did not provide `{p.provides}`")
        p.verify(ir)
        ctx.log(f"{p.name}: {ir.reports[-1].status} in {elapsed:.3f}s")
        ran.append(p.name)
        if p.name in dump_after:
            dumps[p.name] = ir
        if p.name == stop_after:
            return PipelineResult(ir, p.name, dumps)
    return PipelineResult(ir, None, dumps)
