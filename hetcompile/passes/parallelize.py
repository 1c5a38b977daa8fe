"""parallelize: lower placed chains to what vLLM 0.33 runs.

A vLLM replica is a chain of pipeline stages with one TP size on every stage (checked here), an
explicit dtype (fp16 when any stage's GPU lacks bf16: V100, T4, P100, since each mp node would
otherwise resolve `--dtype auto` on its own device), and VLLM_PP_LAYER_PARTITION = the stages'
layer counts. A replica whose stages mix GPU types is marked `mixed` (it lowers to a SkyPilot job
group on Kubernetes, not to a `num_nodes` task).

Paper: Xiong et al., "High-Throughput LLM inference on Heterogeneous Clusters" (Huawei; seed 004), §3.1 (a TP degree t_i per machine, p_i t_i = u_i, and the memory constraint eq. 1); Mei et al., "Helix: Serving Large Language Models over Heterogeneous GPUs and Network via Max-Flow" (ASPLOS 2025; seed 000), §4.3 (one pipeline per replica).
"""

from __future__ import annotations

from hetcompile.errors import PassError
from hetcompile.ir.problem import PassReport, Problem
from hetcompile.passes.base import Pass, PassContext


def replica_dtype(requested: str, bf16_everywhere: bool) -> tuple[str, str | None]:
    if requested == "float16":
        return "float16", None
    if bf16_everywhere:
        return "bfloat16", None
    note = "bf16 was asked for but a stage's GPU lacks bf16: using float16" if requested == "bfloat16" else None
    return "float16", note


class Parallelize(Pass):
    name = "parallelize"
    requires = ("replicas",)

    def run(self, ir: Problem, ctx: PassContext) -> Problem:
        assert ir.replicas is not None  # requires
        out, notes = [], []
        for r in ir.replicas:
            tps = {s.tp for s in r.stages}
            if len(tps) != 1:
                raise PassError(f"parallelize: replica {r.id} has stages with TP sizes {sorted(tps)}; vLLM needs one TP size")
            bf16 = all(ir.gpu(s.gpu).bf16 for s in r.stages)
            dtype, note = replica_dtype(ir.model(r.model).dtype, bf16)
            if note:
                notes.append(f"{r.id}: {note}")
            out.append(r.model_copy(update={"dtype": dtype, "mixed": len({s.gpu for s in r.stages}) > 1}))
        report = PassReport(name=self.name, status="ok", time_s=0.0, notes=tuple(notes))
        return ir.model_copy(update={"replicas": tuple(out), "reports": (*ir.reports, report)})
