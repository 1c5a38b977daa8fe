"""The plan document: what `hetcompile build` promises, as typed data (`OUT/plan.json`).

One pydantic model is the contract between the compiler and everything that reads a plan:
the backends render plan.md from it, `hetcompile explain` and `--previous` replanning load it
back through `read_plan_doc`, and `schemas/plan.schema.json` is generated from it.

Units are the user's: $/h, requests/s, tokens/s, seconds. Floats are rounded to 6 significant
digits when written (backends/canon.py), so the same spec gives the same bytes.

`totals` describe the plan as emitted (after placement), not one solver call: `objective_value`
is what the deployed replicas achieve in the objective's unit (theta = multiple of the demand mix
for max-throughput / min-makespan, $/h for min-cost, x demand per $/h for
max-throughput-per-dollar), and `bound` is a proven bound on that value for the same search
space, or null when no solve proved one (`bound_source` says which solve it comes from).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from hetcompile.ir.names import Name, NodeId, PlanName, ReplicaId
from hetcompile.ir.problem import Binding, ModelPlacement, PrimaryWorkers, Verification
from hetcompile.perf.stepmodel import ReplicaModel

PLAN_FORMAT = "hetcompile-plan/1"


class _Doc(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Compiler(_Doc):
    name: Annotated[str, Field(description="always 'hetcompile'")] = "hetcompile"
    version: Annotated[str, Field(description="hetcompile version that wrote the plan")]
    solver: Annotated[str, Field(description="the MILP solver and its version")]


class PlanModel(_Doc):
    name: Annotated[Name, Field(description="model id")]
    served_name: Annotated[str, Field(description="what clients send as `model` (--served-model-name)")]
    weights: Annotated[str, Field(description="HF repo id or path vllm serve loads")]
    max_model_len: Annotated[int, Field(description="--max-model-len")]
    layers: Annotated[int, Field(description="decoder layers")]


class Slo(_Doc):
    ttft_s: Annotated[float | None, Field(description="time-to-first-token target, seconds")] = None
    tpot_s: Annotated[float | None, Field(description="time-per-output-token target, seconds")] = None
    percentile: Annotated[Literal["p50", "p90", "p95", "p99"], Field(description="share of requests the targets hold for")] = "p99"
    predicted_ttft_s: Annotated[float | None, Field(description="TTFT at the percentile, tail model (perf/tail.py) at the planned load, worst routed replica")] = None
    predicted_tpot_s: Annotated[float | None, Field(description="TPOT at the percentile, tail model at the planned load, worst routed replica")] = None
    simulated_ttft_s: Annotated[float | None, Field(description="TTFT at the percentile in the build's simulation of the plan (null: not verified)")] = None
    simulated_tpot_s: Annotated[float | None, Field(description="TPOT at the percentile in the build's simulation of the plan")] = None
    simulated_attainment: Annotated[float | None, Field(description="share of the simulated requests within every target")] = None
    met: Annotated[bool | None, Field(description="the build's simulation meets every target at the percentile (without one: "
                                                 "every predicted value within its target; null: nothing routed)")] = None


class TailLatency(_Doc):
    """What a workload's requests should see at the plan's own load, at one percentile."""

    percentile: Annotated[Literal["p50", "p90", "p95", "p99"], Field(description="which quantile")] = "p99"
    ttft_s: Annotated[float | None, Field(description="time to first token, worst routed replica (perf/tail.py)")] = None
    tpot_s: Annotated[float | None, Field(description="time per output token, worst routed replica")] = None
    utilization: Annotated[float | None, Field(description="highest planned load / full-load capacity of a routed replica")] = None


class PlanWorkload(_Doc):
    name: str
    model: str
    input_tokens: Annotated[float, Field(description="mean prompt tokens")]
    output_tokens: Annotated[float, Field(description="mean output tokens")]
    demand: Annotated[float, Field(description="lambda_w as the spec gives it (req/s, requests or share)")]
    demand_kind: Literal["rate", "requests", "share"]
    served_requests_per_s: Annotated[float, Field(description="theta * lambda_w: what the plan serves")]
    slo: Annotated[Slo | None, Field(description="the spec's SLO, if any")] = None
    predicted: Annotated[TailLatency | None, Field(description="p99 TTFT and TPOT at the planned load (null: nothing routed)")] = None


class PlanNode(_Doc):
    id: Annotated[NodeId, Field(description="node id (cluster hosts are named after it)")]
    offer: Annotated[str, Field(description="'<region>/<GPU>x<gpus per node>' offer it comes from")]
    region: str
    cloud: str
    gpu: str
    gpus: Annotated[int, Field(description="GPUs on the node")]
    owned_gpus: Annotated[int, Field(description="of which owned (free per hour)")]
    owned: Annotated[bool, Field(description="every GPU is owned")]
    price_per_hour: Annotated[float, Field(description="$/h for the rented GPUs")]


class PlanStage(_Doc):
    node: NodeId
    gpu: str
    region: str
    tp: int
    layers: Annotated[tuple[int, int], Field(description="[start, end) decoder layers")]


class ReplicaWorkload(_Doc):
    capacity_requests_per_s: Annotated[float, Field(description="h_{c,w}: requests/s at full load on this workload alone")]
    planned_max_requests_per_s: Annotated[
        float | None, Field(description="the most requests/s of it the plan may route here: max_utilization x h, or less where "
                                        "the SLO's percentile binds")] = None
    concurrency: Annotated[float, Field(description="C: sequences in flight (KV minimum, --max-num-seqs)")]
    binding: Annotated[str, Field(description="what bounds the capacity: bottleneck-stage, depth, max-num-seqs, measured, stage:<unit>, latency; for an SLO workload slo-tpot, slo-ttft or slo-unmeetable: <reason>")]
    ttft_s: Annotated[float | None, Field(description="estimated time to first token, seconds (an SLO workload: at its percentile and planned_max load)")] = None
    tpot_s: Annotated[float | None, Field(description="estimated time per output token at full load, seconds (an SLO workload: as ttft_s)")] = None


class PlanReplica(_Doc):
    id: Annotated[ReplicaId, Field(description="replica id, never reused across replans (see next_replica)")]
    model: str
    served_name: str
    shape: Annotated[str, Field(description="the candidate shape it instantiates")]
    dtype: Literal["float16", "bfloat16"]
    mixed: Annotated[bool, Field(description="stages of more than one GPU type (a SkyPilot job group)")]
    tp: int
    pp: int
    partition: Annotated[tuple[int, ...], Field(description="layers per stage (VLLM_PP_LAYER_PARTITION)")]
    stages: tuple[PlanStage, ...]
    kv_capacity_tokens: Annotated[int, Field(description="KV cache in tokens, the minimum over stages")]
    prefill_tokens_per_s: float
    decode_tokens_per_s: float
    estimate_source: Literal["analytic", "measured"]
    workloads: Annotated[dict[str, ReplicaWorkload], Field(description="capacity per workload this replica can serve")]
    price_per_hour: Annotated[float, Field(description="$/h of its nodes")]
    step_model: Annotated[ReplicaModel | None, Field(description="step times its capacity comes from (perf/stepmodel.py); the simulator replays them")] = None


class Totals(_Doc):
    requests_per_s: float
    tokens_per_s: Annotated[float, Field(description="prompt + output tokens/s served")]
    output_tokens_per_s: float
    price_per_hour: Annotated[float, Field(description="$/h of every node (owned GPUs free)")]
    budget_per_hour: float | None
    scale: Annotated[float, Field(description="theta: multiple of the spec's demand mix served")]
    gpus: int
    objective: Literal["max-throughput", "min-cost", "max-throughput-per-dollar", "min-makespan"]
    objective_value: Annotated[float | None, Field(description="what the emitted plan achieves, in the objective's unit")]
    objective_unit: Annotated[str, Field(description="'x demand', '$/h' or 'x demand per $/h'")]
    bound: Annotated[float | None, Field(description="proven bound on objective_value (upper for max, lower for min)")]
    gap: Annotated[float | None, Field(description="|bound - value| / |value|")]
    bound_source: Annotated[str, Field(description="which solve proved the bound, or why there is none")]
    makespan_s: Annotated[float | None, Field(description="1/theta when demand is a request count")] = None
    tokens_per_dollar: Annotated[float | None, Field(description="tokens per $ (tokens/s per $/s)")] = None
    binding: Annotated[tuple[Binding, ...], Field(description="what stops the plan from growing")]


class PassSummary(_Doc):
    name: str
    status: str
    objective: float | None = None
    bound: float | None = None
    gap: float | None = None
    notes: tuple[str, ...] = ()


class EngineSettings(_Doc):
    max_num_seqs: int
    gpu_memory_utilization: float
    port: int
    router_port: int


class PlanDoc(_Doc):
    """`OUT/plan.json`."""

    format: Annotated[Literal["hetcompile-plan/1"], Field(description="document format and version")] = PLAN_FORMAT
    compiler: Compiler
    plan: Annotated[PlanName, Field(description="the spec's name")]
    spec_hash: Annotated[str, Field(description="sha256 of the spec file")]
    models: tuple[PlanModel, ...]
    workloads: tuple[PlanWorkload, ...]
    engine: EngineSettings
    nodes: tuple[PlanNode, ...]
    replicas: tuple[PlanReplica, ...]
    routing: Annotated[dict[str, dict[str, float]], Field(description="workload class -> replica -> weight")]
    totals: Totals
    passes: tuple[PassSummary, ...]
    placement: Annotated[tuple[ModelPlacement, ...], Field(description="mixed pipelines: what placement found per model")] = ()
    primary_workers: Annotated[
        tuple[PrimaryWorkers, ...] | None,
        Field(description="mixed pipelines: Hetis primary-worker selection per replica, GPUs left out and what they would add "
                          "as attention workers (absent when selection changed nothing)"),
    ] = None
    max_utilization: Annotated[float, Field(description="headroom: the most of its full-load capacity a replica is planned at")] = 0.85
    verification: Annotated[
        Verification | None, Field(description="the build's simulation of the plan at its planned load (null: no SLO to check)")
    ] = None
    next_replica: Annotated[int, Field(ge=0, le=999_999_999, description="replica ids r0 .. r{next_replica-1} are taken, in this plan or earlier ones")]
