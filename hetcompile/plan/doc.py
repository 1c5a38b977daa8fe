"""The plan document: what `hetcompile build` promises, as typed data (`OUT/plan.json`).

One pydantic model is the contract between the compiler and everything that reads a plan:
the backends render plan.md from it, `hetcompile explain` and `--previous` replanning load it
back through `read_plan_doc`, and `schemas/plan.schema.json` is generated from it.

Units are the user's: $/h, requests/s, tokens/s, seconds. Floats are rounded to 6 significant
digits when written (plan/canon.py), so the same spec gives the same bytes.

`totals` describe the plan as emitted (after placement), not one solver call: `objective_value`
is what the deployed replicas achieve in the objective's unit (theta = multiple of the demand mix
for max-throughput / min-makespan, $/h for min-cost, x demand per $/h for
max-throughput-per-dollar), and `bound` is a proven bound on that value for the same search
space, or null when no solve proved one (`bound_source` says which solve it comes from).

The records the passes report into the plan (`Binding`, `ModelPlacement`, `ChainSummary`,
`PrimaryWorkers`, ...) are declared here and carried by the problem IR, so the schema changes only
where this file changes (tests/test_pipeline.py pins schemas/plan.schema.json).
"""

from __future__ import annotations

from typing import Annotated, Final, Literal

from pydantic import Field, SerializerFunctionWrapHandler, model_serializer

from hetcompile.frozen import Frozen
from hetcompile.names import Name, NodeId, PlanName, ReplicaId
from hetcompile.perf.stepmodel import ReplicaModel
from hetcompile.plan.observed import Observation
from hetcompile.plan.step_record import StepModelRecord
from hetcompile.perf.tail import DEFAULT_MAX_UTILIZATION

PLAN_FORMAT: Final = "hetcompile-plan/1"

# what an SLO's targets hold for (perf/tail.py's PERCENTILES)
Percentile = Literal["p50", "p90", "p95", "p99"]

# what bounds one replica's capacity for one workload: perf/capacity.py's terms, a measured
# profile, or (an SLO workload) perf/tail.py's
CapacityBound = Literal["bottleneck-stage", "depth", "max-num-seqs", "measured", "queueing",
                        "slo-ttft", "slo-tpot", "slo-headroom", "slo-unmeetable"]


class Binding(Frozen):
    """A constraint that stops the plan from growing (or, for `demand`, that it meets exactly)."""

    kind: Annotated[Literal["budget", "availability", "demand", "placement", "slo", "other"],
                    Field(description="which constraint family")]
    subject: Annotated[str | None, Field(description="what it is about: the offer id for availability")] = None
    used: Annotated[float | None, Field(description="how much of the limit the plan uses")] = None
    limit: Annotated[float | None, Field(description="the limit")] = None
    unit: Annotated[str | None, Field(description="unit of used and limit: '$/h', 'GPUs', 'x demand'")] = None
    text: Annotated[str, Field(description="the same, in words")]


class ChainSummary(Frozen):
    """place (mixed pipelines): one replica's chain under the depth-aware model (placement/evaluate.py)."""

    replica: str
    depth: int
    tp: int
    concurrency: float = Field(description="C: requests in flight (KV minimum over stages, max-num-seqs)")
    concurrency_limit: Literal["kv", "max-num-seqs"] = Field(description="what caps C: one stage's KV cache, or --max-num-seqs")
    concurrency_limit_node: NodeId | None = Field(default=None, description="kv: the node (or TP slice) whose KV cache caps C")
    micro_batch: float = Field(description="b = C / depth")
    capacity_tokens_per_s: float = Field(description="prompt + decode tokens/s at the model's mean workload: perf/capacity.py's full mode, what the plan reports")
    search_capacity_tokens_per_s: float = Field(default=0.0, description="the same by the formula's fast (fluid) mode, what placement's search ranked it by")
    binding: Literal["stage", "latency"] = Field(description="what bounds the chain in the fast mode: its slowest stage, or the pipeline round trip (incl. hops)")
    binding_node: NodeId | None = Field(default=None, description="stage: the node (or TP slice) of the slowest stage")
    helix_flow: float = Field(description="Helix semantics: min of T(k) over stages and link capacity over hops")
    split_nodes: tuple[str, ...] = ()


class ModelPlacement(Frozen):
    """place (mixed pipelines): what Helix max-flow placement found for one model, and what was kept."""

    model: str
    objective: Literal["depth-aware", "helix"]
    kept: Literal["placement", "compose"] = Field(description="whose replicas the plan deploys")
    pool_nodes: int
    pool_gpus: int
    status: str
    helix_flow: float = Field(description="Helix-semantics flow of the placed chains, tokens/s")
    depth_aware_capacity: float = Field(description="the search's objective: the placed chains' capacity by the formula's fast mode, tokens/s (bound and gap refer to it)")
    capacity: float = Field(default=0.0, description="the placed chains' capacity by the full mode (what the plan reports), tokens/s")
    bound: float | None = None
    gap: float | None = None
    incumbent_source: str = ""
    shared_helix_flow: float | None = Field(default=None, description="shared per-request pipelines (not deployable)")
    shared_depth_aware_capacity: float | None = None
    shared_bound: float | None = None
    shared_gap: float | None = None
    compose_depth_aware_capacity: float = Field(description="compose's single-type replicas, same model, fast mode")
    compose_capacity: float = Field(default=0.0, description="compose's single-type replicas, same model, full mode")
    scale_placement: float = Field(description="theta with the placed chains")
    scale_compose: float = Field(description="theta with compose's replicas, evaluated by the same model")
    # optional: plans written before it was added still read back (explain, --previous)
    scale_single_type: float | None = Field(default=None, description="theta with compose's replicas by their own estimates: what the single-type plan serves")
    chains: tuple[ChainSummary, ...] = ()


class LeftOutGpus(Frozen):
    """place (mixed): GPUs of one type that Hetis primary-worker selection kept out of a replica."""

    gpu: str
    gpus: int
    nodes: tuple[str, ...] = Field(description="pool node ids (a TP slice as <node>#<j>)")
    adds: float = Field(description="C(kept) / C(kept + these) - 1: what they would add to the replica's dense speed (< delta)")
    fate: Literal["moved", "not-rented", "idle", "kept-in"] = Field(
        description="moved to another replica, not rented (cost saved), owned and idle, or kept in (the plan without "
                    "them served less)")
    to_replica: str | None = None
    saved_per_s: float = Field(default=0.0, description="$/s not paid because they are not rented")


class AttentionWorkers(Frozen):
    """What left-out GPUs would add as Hetis Attention workers (perf/attention.py); NOT deployable on vLLM 0.33."""

    gpus: int
    kv_tokens: float
    kv_tokens_with: float
    decode_tokens_per_s: float
    decode_tokens_per_s_with: float
    offload_share: float = Field(description="rho: share of the query heads offloaded (0: offload does not pay)")
    transfer_s_per_layer: float = Field(description="eq. 4 per layer per step at the chosen share: 2 alpha + beta V b")
    link_latency_s: float
    link_bandwidth: float


class PrimaryWorkers(Frozen):
    """place (mixed): Hetis primary-worker selection (seed 001 §4.1, placement/hetis.py) for one replica."""

    model: str
    replica: str
    delta: float
    kept: tuple[tuple[str, int], ...] = Field(description="GPU type -> GPUs kept as primary workers")
    dense_cost_s: float = Field(description="C(kept): max stage dense cost per step, s (unified stages, perfect scaling)")
    full_dense_cost_s: float = Field(description="C with every GPU placement gave the replica")
    applied: bool
    left_out: tuple[LeftOutGpus, ...] = ()
    attention: AttentionWorkers | None = None
    text: tuple[str, ...] = Field(default=(), description="what plan.md and explain say")


class Marginal(Frozen):
    """What relaxing one binding constraint by one step buys (a re-solve of compose, not a dual)."""

    kind: Annotated[Literal["budget", "availability"], Field(description="the constraint relaxed")]
    subject: Annotated[str | None, Field(description="the offer id for availability")] = None
    step: Annotated[str, Field(description="the relaxation, in words: '+$4.40/h budget', '+1 node of <offer>'")]
    step_per_hour: Annotated[float | None, Field(description="$/h the step adds to the budget (budget only)")] = None
    scale_delta: Annotated[float, Field(description="change of theta (x the demand mix)")]
    requests_per_s_delta: Annotated[float | None, Field(description="change of served req/s (workloads with rates)")] = None
    text: str


class WhatItWouldTake(Frozen):
    """compose's what-if re-solves: the budget that serves the whole demand, and marginal values."""

    full_demand_price_per_hour: Annotated[float | None, Field(
        description="least $/h of a plan that meets every workload rate (min-cost re-solve without the budget) "
                    "at this plan's tail factors; None when availability cannot meet it")] = None
    full_demand_floor_per_hour: Annotated[float | None, Field(
        description="the same re-solve at tail factor 1 (the tail model's load), when this plan's verification "
                    "left a factor below 1 and that lowers the price: no verified plan of full demand costs less")] = None
    max_scale_without_budget: Annotated[float | None, Field(
        description="theta the offered GPUs reach with no budget (when they cannot meet every rate)")] = None
    marginals: tuple[Marginal, ...] = ()
    solves: Annotated[int, Field(description="re-solves made (bounded)")] = 0
    text: tuple[str, ...] = ()


class FrontierPoint(Frozen):
    """One plan of compose's budget sweep: the best at that budget (max theta, then least cost)."""

    budget_per_hour: Annotated[float, Field(description="the budget B_k it was solved at")]
    price_per_hour: Annotated[float, Field(description="what that plan costs")]
    scale: Annotated[float, Field(description="theta: x the demand mix served")]
    requests_per_s: Annotated[float, Field(description="theta x total demand")]
    tpot_s: Annotated[float | None, Field(description="rate-weighted mean TPOT of its replicas")] = None
    this_plan: Annotated[bool, Field(description="the emitted plan's composition")] = False
    pareto: Annotated[bool, Field(description="no other point serves more for no more $/h")] = True


class RunnerUp(Frozen):
    """The best plan without one of the shapes this plan uses, and why it lost."""

    without: Annotated[str, Field(description="the shape id left out")]
    label: str
    price_per_hour: float | None = None
    scale: float
    requests_per_s: float
    tpot_s: float | None = None
    text: Annotated[str, Field(description="the runner-up and the one reason it lost, in words")]


class Alternatives(Frozen):
    frontier: tuple[FrontierPoint, ...] = ()
    runners_up: tuple[RunnerUp, ...] = ()


class VerifiedWorkload(Frozen):
    """What the build's simulation measured for one workload (simulate/verify.py), against its SLO or,
    without one, the queueing bound (p99 TTFT within max_ttft_slowdown x the idle TTFT)."""

    name: str
    target: Literal["slo", "queueing"] = Field(description="slo: the spec's targets; queueing: the default bound")
    percentile: str
    ttft_target_s: float | None = Field(description="the TTFT target at the percentile (queueing: the bound)")
    tpot_target_s: float | None = Field(description="the TPOT target at the percentile")
    ttft_s: float | None = Field(description="simulated TTFT at the percentile")
    tpot_s: float | None = Field(description="simulated TPOT at the percentile")
    p99_ttft_s: float | None = Field(description="simulated p99 TTFT")
    p99_tpot_s: float | None = Field(description="simulated p99 TPOT")
    attainment: float | None = Field(description="share of requests within every target")
    met: bool = Field(description="the share of requests within every target is at least the percentile's, at the lower 95% "
                                  "confidence bound over independent replications (simulate/verify.py)")
    factor: float = Field(description="share of the tail model's load the plan was left with")
    ttft_ratio: float | None = Field(default=None, description=(
        "the judged TTFT percentile over its target: the smallest bound the share of requests outside meets at its "
        "upper 95% confidence bound (simulate/verify.py), over the target; above 1 the target misses. The verify "
        "pass steers its next load share by it"))
    tpot_ratio: float | None = Field(default=None, description="the same for TPOT")


class VerifiedPart(Frozen):
    """One independently replayed part of the plan (simulate/verify.py): workloads and the replicas
    they are routed to that share no replica with the rest, each run as long as its own rates need."""

    workloads: tuple[str, ...] = Field(description="the part's workloads, targeted or not, in name order")
    replicas: tuple[str, ...] = Field(description="the replicas they are routed to")
    replications: int = Field(description="independent replications of this part (fewer than the others where its targets "
                                          "missed beyond doubt on the first ones)")
    requests: int = Field(description="requests measured, all replications")
    duration_s: float = Field(description="seconds of arrivals per replication")
    warmup_s: float = Field(description="of which warm-up, per replication")


class Verification(Frozen):
    """The build's check of the plan by simulation: seeded, work-bounded (requests, not seconds)."""

    seed: int = Field(description="seed of the first replication; replication r runs with seed + r")
    replications: int = Field(default=1, description="independent replications per round (the most of any part)")
    requests: int = Field(description="requests measured in the last round, all replications and parts")
    duration_s: float = Field(description="seconds of arrivals per replication (the longest part's)")
    warmup_s: float = Field(description="of which warm-up, per replication (the longest part's)")
    parts: tuple[VerifiedPart, ...] = Field(default=(), description=(
        "the parts replayed one by one: where the targeted workloads fall into groups that share no replica, each "
        "group is its own simulation, as long as its own rates need (one part: the plan replayed whole)"))
    rounds: int = Field(description="plans simulated in all (1: the first plan held); the other figures are those of "
                                    "the plan kept, which may be an earlier round's")
    workloads: tuple[VerifiedWorkload, ...]
    unmet: tuple[str, ...] = Field(default=(), description="queueing bounds the last plan still misses (no SLO: the plan stands, "
                                                           "with this said)")


class Compiler(Frozen):
    name: Annotated[str, Field(description="always 'hetcompile'")] = "hetcompile"
    version: Annotated[str, Field(description="hetcompile version that wrote the plan")]
    solver: Annotated[str, Field(description="the MILP solver and its version")]


class PlanModel(Frozen):
    name: Annotated[Name, Field(description="model id")]
    served_name: Annotated[str, Field(description="what clients send as `model` (--served-model-name)")]
    weights: Annotated[str, Field(description="HF repo id or path vllm serve loads")]
    max_model_len: Annotated[int, Field(description="--max-model-len")]
    layers: Annotated[int, Field(description="decoder layers")]


class Slo(Frozen):
    ttft_s: Annotated[float | None, Field(description="time-to-first-token target, seconds")] = None
    tpot_s: Annotated[float | None, Field(description="time-per-output-token target, seconds")] = None
    percentile: Annotated[Percentile, Field(description="share of requests the targets hold for")] = "p99"
    predicted_ttft_s: Annotated[float | None, Field(description="TTFT at the percentile, tail model (perf/tail.py) at the planned load, worst routed replica")] = None
    predicted_tpot_s: Annotated[float | None, Field(description="TPOT at the percentile, tail model at the planned load, worst routed replica")] = None
    simulated_ttft_s: Annotated[float | None, Field(description="TTFT at the percentile in the build's simulation of the plan (null: not verified)")] = None
    simulated_tpot_s: Annotated[float | None, Field(description="TPOT at the percentile in the build's simulation of the plan")] = None
    simulated_attainment: Annotated[float | None, Field(description="share of the simulated requests within every target")] = None
    met: Annotated[bool | None, Field(description="the build's simulation meets every target at the percentile (without one: "
                                                 "every predicted value within its target; null: nothing routed)")] = None


class TailLatency(Frozen):
    """What a workload's requests should see at the plan's own load, at one percentile."""

    percentile: Annotated[Percentile, Field(description="which quantile")] = "p99"
    ttft_s: Annotated[float | None, Field(description="time to first token, worst routed replica (perf/tail.py)")] = None
    tpot_s: Annotated[float | None, Field(description="time per output token, worst routed replica")] = None
    utilization: Annotated[float | None, Field(description="highest planned load / full-load capacity of a routed replica")] = None


class PlanWorkload(Frozen):
    name: str
    model: str
    input_tokens: Annotated[float, Field(description="mean prompt tokens")]
    output_tokens: Annotated[float, Field(description="mean output tokens")]
    demand: Annotated[float, Field(description="lambda_w as the spec gives it (req/s, requests or share)")]
    demand_kind: Literal["rate", "requests", "share"]
    served_requests_per_s: Annotated[float, Field(description="theta * lambda_w: what the plan serves")]
    slo: Annotated[Slo | None, Field(description="the spec's SLO, if any")] = None
    predicted: Annotated[TailLatency | None, Field(description="p99 TTFT and TPOT at the planned load by the tail model "
                                                              "(perf/tail.py; null: nothing routed)")] = None
    simulated: Annotated[TailLatency | None, Field(description="p99 TTFT and TPOT at the planned load in the build's seeded "
                                                              "simulation of the whole plan (`verification`); the plan's statement "
                                                              "of its tail (null: nothing routed)")] = None


class PlanNode(Frozen):
    id: Annotated[NodeId, Field(description="node id (cluster hosts are named after it)")]
    offer: Annotated[str, Field(description="'<region>/<GPU>x<gpus per node>' offer it comes from")]
    region: str
    cloud: str
    gpu: str
    gpus: Annotated[int, Field(description="GPUs on the node")]
    owned_gpus: Annotated[int, Field(description="of which owned (free per hour)")]
    owned: Annotated[bool, Field(description="every GPU is owned")]
    price_per_hour: Annotated[float, Field(description="$/h for the rented GPUs")]


class PlanPrice(Frozen):
    offer: Annotated[str, Field(description="'<region>/<GPU>x<gpus per node>'")]
    gpu: str
    region: str
    cloud: str
    price_per_gpu_hour: Annotated[float, Field(description="$ per GPU-hour the plan was costed with")]
    source: Annotated[str, Field(description="'spec', or 'catalog default (<source>, checked <date>)'")]


class PlanStage(Frozen):
    node: NodeId
    gpu: str
    region: str
    tp: int
    layers: Annotated[tuple[int, int], Field(description="[start, end) decoder layers")]


class ReplicaWorkload(Frozen):
    capacity_requests_per_s: Annotated[float, Field(description="h_{c,w}: requests/s at full load on this workload alone")]
    planned_max_requests_per_s: Annotated[
        float | None, Field(description="the most requests/s of it the plan may route here: max_utilization x h, or less where "
                                        "the SLO's percentile binds")] = None
    concurrency: Annotated[float, Field(description="C: sequences in flight (KV minimum, --max-num-seqs)")]
    binding: Annotated[CapacityBound, Field(description="what bounds the capacity: the slowest stage (bottleneck-stage), the pipeline round trip (depth), --max-num-seqs, a measured profile; for an SLO workload the target that caps the load (slo-ttft, slo-tpot), the headroom (slo-headroom) or none met (slo-unmeetable)")]
    binding_reason: Annotated[str | None, Field(description="slo-*: why, in words (e.g. which target no concurrency meets)")] = None
    ttft_s: Annotated[float | None, Field(description="estimated time to first token, seconds (an SLO workload: at its percentile and planned_max load)")] = None
    tpot_s: Annotated[float | None, Field(description="estimated time per output token at full load, seconds (an SLO workload: as ttft_s)")] = None


class PlanReplica(Frozen):
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
    step_source: Annotated[str | None, Field(description="where the step model's GPU times come from: kernels (measured kernel tables), roofline, kernels+roofline (a chain of both), fitted (a measured profile)")] = None
    workloads: Annotated[dict[str, ReplicaWorkload], Field(description="capacity per workload this replica can serve")]
    price_per_hour: Annotated[float, Field(description="$/h of its nodes")]
    step_model: Annotated[StepModelRecord | None, Field(description="step times its capacity comes from (perf/stepmodel.py, recorded by plan/step_record.py); the simulator replays them")] = None
    engine_args: Annotated[tuple[str, ...], Field(description="the vLLM engine flags every node of it runs with, '--flag value' each (ir/engine.py; node-specific flags such as rank, host and port are not listed): a change here is a change of the replica")] = ()
    role: Annotated[Literal["prefill", "decode"] | None, Field(description="prefill or decode: one phase of a disaggregated group (`groups`); absent: whole requests")] = None
    group: Annotated[str | None, Field(description="the disaggregated group it belongs to (absent: none)")] = None

    @model_serializer(mode="wrap")
    def _omit_no_role(self, handler: SerializerFunctionWrapHandler) -> dict:
        # a replica that runs whole requests is written as before P/D existed: plan.json keeps its bytes
        data = handler(self)
        for k in ("role", "group"):
            if data.get(k) is None:
                data.pop(k, None)
        return data

    def replica_model(self) -> ReplicaModel | None:
        """perf's step model of `step_model` (None: the plan carries none for this replica)."""
        return self.step_model.model() if self.step_model is not None else None

    def load(self, rates: dict[str, float], eps: float = 1e-12) -> float:
        """U_r = sum_w x_{r,w} / h_{r,w}: the share of its full-load capacity the requests/s `rates`
        take (plan.md's and explain's busy share for the planned rates, simulate's for the served
        ones); a workload with rate but no capacity here counts as filling the replica."""
        u = 0.0
        for w, x in rates.items():
            if x <= eps:
                continue
            h = self.workloads[w].capacity_requests_per_s if w in self.workloads else None
            u += x / h if h and h > eps else 1.0
        return u


class PlanGroup(Frozen):
    """A disaggregated group (issue 35): a workload's prompts run on its prefill replicas, its KV moves
    over the region's link, and its output tokens run on its decode replicas. `routing` names the
    decode replicas with the group's share of the workload; a request routed to one is prefilled
    first on one of `prefill` (the router's two-step flow, router/disagg.py)."""

    id: Annotated[str, Field(description="group id (the routing table's)")]
    workload: str
    model: str
    prefill: Annotated[dict[str, float], Field(description="prefill replica -> its share of the group's prompts")]
    decode: Annotated[dict[str, float], Field(description="decode replica -> its share of the group's requests")]
    transfer_s: Annotated[float, Field(description="T_KV: one prompt's KV over the link from prefill to decode, seconds")]


class AlternativeWorkload(Frozen):
    name: str
    served_requests_per_s: float
    ttft_s: Annotated[float | None, Field(description="p99 TTFT: simulated where the alternative was verified, else the tail model's")]
    tpot_s: Annotated[float | None, Field(description="p99 TPOT, the same way")]
    met: Annotated[bool | None, Field(description="its SLO met (null: no SLO)")] = None


class AggregatedAlternative(Frozen):
    """The same spec built with `disaggregation: off` by the same pipeline (verification included):
    what the plan's disaggregated groups are weighed against."""

    scale: Annotated[float, Field(description="theta: multiple of the demand mix it serves")]
    price_per_hour: float
    replicas: int
    gpus: int
    verified: Annotated[bool, Field(description="its p99s are the build's simulation's (else the tail model's)")]
    workloads: tuple[AlternativeWorkload, ...]


class Totals(Frozen):
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


class PassSummary(Frozen):
    name: str
    status: str
    objective: float | None = None
    bound: float | None = None
    gap: float | None = None
    notes: tuple[str, ...] = ()


class EngineSettings(Frozen):
    max_num_seqs: int
    gpu_memory_utilization: float
    port: int
    router_port: int


class PlanDoc(Frozen):
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
    routing: Annotated[dict[str, dict[str, float]], Field(description="workload class -> replica -> weight (a disaggregated group's requests: its decode replicas)")]
    groups: Annotated[tuple[PlanGroup, ...] | None, Field(description="prefill/decode disaggregated groups (absent: none)")] = None
    aggregated: Annotated[AggregatedAlternative | None, Field(description="disaggregation: auto: the best plan without groups, "
                                                                          "built and verified the same way (absent: not built)")] = None
    totals: Totals
    passes: tuple[PassSummary, ...]
    placement: Annotated[tuple[ModelPlacement, ...], Field(description="mixed pipelines: what placement found per model")] = ()
    primary_workers: Annotated[
        tuple[PrimaryWorkers, ...] | None,
        Field(description="mixed pipelines: Hetis primary-worker selection per replica, GPUs left out and what they would add "
                          "as attention workers (absent when selection changed nothing)"),
    ] = None
    max_utilization: Annotated[float, Field(description="headroom: the most of its full-load capacity a replica is planned at")] = DEFAULT_MAX_UTILIZATION
    max_ttft_slowdown: Annotated[float | None, Field(description="without an SLO: p99 TTFT within this multiple of the idle TTFT "
                                                                 "(null: no such bound)")] = None
    verification: Annotated[
        Verification | None, Field(description="the build's simulation of the plan at its planned load (null: nothing routed)")
    ] = None
    next_replica: Annotated[int, Field(ge=0, le=999_999_999, description="replica ids r0 .. r{next_replica-1} are taken, in this plan or earlier ones")]
    prices: Annotated[tuple[PlanPrice, ...], Field(description="every offer's price and where it came from")] = ()
    warnings: Annotated[tuple[str, ...], Field(description="what the spec left to defaults ('file:line:col: text')")] = ()
    what_it_would_take: Annotated[
        WhatItWouldTake | None,
        Field(description="max-throughput with rates: the least $/h that serves the whole demand, and what one more "
                          "step of each binding constraint buys (compose re-solves)"),
    ] = None
    alternatives: Annotated[
        Alternatives | None,
        Field(description="max-throughput under a budget: the cost vs demand frontier of a budget sweep (this plan marked) "
                          "and the best plans without each shape this plan uses (compose re-solves)"),
    ] = None
    observed: Annotated[
        Observation | None,
        Field(description="build --observed: the measured rates, lengths and step-time corrections used in place of the spec's"),
    ] = None
