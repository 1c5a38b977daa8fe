"""Pass 9, disaggregation: the plan's disaggregated groups weighed against the best plan without them.

With `disaggregation: auto` compose may give an SLO workload prefill and decode replicas of its own
(passes/profile_pd.py). vLLM's documentation is plain that the split does not raise throughput by
itself; it buys separate control of TTFT and TPOT and a GPU type per phase. So where compose took a
split, the same spec is built again with phase shapes off, through the same passes (verification
included, so both plans' p99s are the simulator's), and plan.json's `aggregated` says what that
plan serves, costs and reaches. Where compose took no split, the plan is that alternative, and the
pass says so without a second build.
"""

from __future__ import annotations

from hetcompile.ir.document import plan_doc
from hetcompile.ir.problem import PassReport, Problem
from hetcompile.passes.base import Pass, PassContext
from hetcompile.plan import human
from hetcompile.plan.doc import AggregatedAlternative, AlternativeWorkload


def alternative(alt: Problem) -> AggregatedAlternative:
    """plan.json's summary of the plan built without groups."""
    doc = plan_doc(alt)
    verified = {v.name: v for v in alt.verification.workloads} if alt.verification is not None else {}
    ws = []
    for w in doc.workloads:
        v = verified.get(w.name)
        tail = w.simulated if v is not None and w.simulated is not None else w.predicted
        ws.append(AlternativeWorkload(name=w.name, served_requests_per_s=w.served_requests_per_s,
                                      ttft_s=tail.ttft_s if tail else None, tpot_s=tail.tpot_s if tail else None,
                                      met=w.slo.met if w.slo is not None else None))
    return AggregatedAlternative(scale=doc.totals.scale, price_per_hour=doc.totals.price_per_hour, replicas=len(doc.replicas),
                                 gpus=doc.totals.gpus, verified=bool(verified), workloads=tuple(ws))


class Disaggregation(Pass):
    name = "disaggregation"
    requires = ("routing",)
    provides = ""  # `aggregated`, where the plan has groups

    def run(self, ir: Problem, ctx: PassContext) -> Problem:
        assert ir.routing is not None  # required
        if not ir.routing.groups:
            n = sum(1 for s in ir.shapes or () if s.role is not None)
            why = (f"compose weighed {human.plural(n, 'prefill/decode shape')} for the SLO workloads and took none: the "
                   "aggregated replicas serve more for the money" if n else
                   "no prefill/decode pair meets an SLO workload's targets on the offered GPUs (or no workload has an SLO)")
            return ir.model_copy(update={"reports": (*ir.reports, PassReport(
                name=self.name, status="ok", time_s=0.0, notes=(why,)))})
        ctx.on_pass(f"{self.name}: the plan without groups")
        alt = ctx.replan({"disaggregation": False, "tail_factors": ()})
        summary = alternative(alt)
        split = [g.id for g in ir.routing.groups]
        note = (f"{human.plural(len(split), 'group')} ({', '.join(split)}); without them the same spec's best plan serves "
                f"{human.number(summary.scale)}x the demand for ${summary.price_per_hour:.2f}/h")
        ctx.log(f"disaggregation: {note}")
        notes = (note, *aws_notes(ir))
        for extra in notes[1:]:
            ctx.log(f"disaggregation: {extra}")
        return ir.model_copy(update={"aggregated": summary, "reports": (*ir.reports, PassReport(
            name=self.name, status="ok", time_s=0.0, notes=notes))})


def aws_notes(ir: Problem) -> tuple[str, ...]:
    """What a user must open by hand before the groups in AWS regions can move KV: each replica is its
    own SkyPilot cluster, and on AWS a cluster with ports gets a security group of its own
    (sky-sg-<cluster>), so the NIXL side channel and UCX's TCP ports between a group's clusters are closed."""
    assert ir.replicas is not None and ir.nodes is not None
    clouds = {n.id: n.cloud for n in ir.nodes}
    aws = sorted({r.group for r in ir.replicas if r.group is not None and clouds[r.stages[0].node] == "aws"})
    if not aws:
        return ()
    return (f"AWS: before {', '.join(aws)} can move KV, allow TCP between the security groups of their clusters "
            "(sky-sg-<cluster>): the NIXL side channel (5600) and UCX's data ports; SkyPilot opens only the vLLM "
            "port (docs/disaggregation.md)",)
