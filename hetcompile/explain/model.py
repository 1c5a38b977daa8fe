"""The JSON output of `hetcompile explain` (`--format json`): an `Explanation` or a `PlanDiff`.

`schemas/explain.schema.json` is generated from `ExplainOutput` (a union on `kind`), so the
schema and the output cannot drift. Values are frozen; lists are sorted by the producer; floats
go through `canon()` (6 significant digits) when serialized. Rates are requests/s, prices $/h,
times seconds, utilisation a fraction (1 = busy all the time). Notation: hetcompile/explain/rates.py.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Union

from pydantic import Field, TypeAdapter, model_validator

from hetcompile.frozen import Frozen
from hetcompile.plan.doc import ModelPlacement, PrimaryWorkers

SCHEMA_VERSION = 1




# --------------------------------------------------------------------------- explain


class Bottleneck(Frozen):
    """What bounds a chain's capacity for one workload."""

    kind: Annotated[
        Literal["stage", "hops", "max-num-seqs", "measured", "other"],
        Field(description="stage: the slowest stage paces decode; hops: the pipeline round trip (stages plus "
                          "the links between them); max-num-seqs: the engine's sequence cap; measured: a "
                          "measured profile, no model of what binds"),
    ]
    stage: Annotated[int | None, Field(description="index of the bottleneck stage (kind stage)")] = None
    hops: Annotated[tuple[str, ...], Field(description="the links between stages, 'region->region' (kind hops)")] = ()
    text: Annotated[str, Field(description="the same in words")]


class StageView(Frozen):
    index: Annotated[int, Field(description="position in the pipeline, 0 first")]
    node: Annotated[str, Field(description="node id")]
    offer: Annotated[str | None, Field(description="offer the node comes from")]
    gpu: Annotated[str, Field(description="GPU type")]
    region: Annotated[str, Field(description="region")]
    tp: Annotated[int, Field(description="tensor-parallel degree")]
    layers: Annotated[tuple[int, int], Field(description="decoder layers [start, end)")]
    work_share: Annotated[float, Field(description="t_i / max_j t_j: the stage step times of the replica's step model (layers / tp without one; 1: the heaviest stage)")]
    utilisation: Annotated[float, Field(description="replica utilisation x work_share")]
    bottleneck: Annotated[bool, Field(description="the heaviest stage of the chain (none when all stages weigh the same)")]


class ReplicaLoad(Frozen):
    workload: Annotated[str, Field(description="workload name")]
    weight: Annotated[float, Field(description="p_{r,w}: share of the workload's traffic routed here")]
    routed_requests_per_s: Annotated[float, Field(description="x_{r,w} = p_{r,w} s_w")]
    capacity_requests_per_s: Annotated[float | None, Field(description="h_{r,w}: requests/s the replica serves of this workload alone (null: no estimate)")]
    time_share: Annotated[float, Field(description="x_{r,w} / h_{r,w}: share of the replica's time on this workload")]
    concurrency: Annotated[float | None, Field(description="C: concurrent sequences the KV minimum (or --max-num-seqs) allows")]
    concurrency_limit: Annotated[
        Literal["kv-memory", "max-num-seqs", "measured", "unknown"],
        Field(description="what caps C, the concurrent sequences"),
    ]
    bottleneck: Annotated[Bottleneck, Field(description="what bounds capacity for this workload")]
    ttft_s: Annotated[float | None, Field(description="estimated time to first token, s")]
    tpot_s: Annotated[float | None, Field(description="estimated time per output token, s")]


class ReplicaView(Frozen):
    id: Annotated[str, Field(description="replica id")]
    model: Annotated[str, Field(description="model name")]
    shape: Annotated[str | None, Field(description="candidate shape the replica instantiates")]
    gpu: Annotated[str, Field(description="GPU type(s), '+'-joined")]
    regions: Annotated[tuple[str, ...], Field(description="regions of its stages, in stage order, deduplicated")]
    tp: Annotated[int | None, Field(description="tensor-parallel degree")]
    pp: Annotated[int, Field(description="pipeline depth (stages)")]
    gpus: Annotated[int, Field(description="GPUs it runs on (sum of TP over stages)")]
    price_per_hour: Annotated[float, Field(description="$/h of its nodes")]
    kv_capacity_tokens: Annotated[float | None, Field(description="KV cache in tokens (minimum over stages)")]
    estimate_source: Annotated[str, Field(description="analytic (datasheet model) or measured (spec profile)")]
    utilisation: Annotated[float, Field(description="U_r at the plan's served rates")]
    bottleneck: Annotated[Bottleneck, Field(description="what binds for the workload that takes most of its time")]
    stages: Annotated[tuple[StageView, ...], Field(description="stages in pipeline order")]
    workloads: Annotated[tuple[ReplicaLoad, ...], Field(description="per workload load, sorted by name")]
    placement: Annotated[dict[str, Any] | None, Field(
        description="the replica's chain from the plan's placement block (depth, C, binding, Helix flow), when present")] = None


class PlanBinding(Frozen):
    kind: Annotated[
        Literal["budget", "availability", "demand", "placement", "slo", "memory", "link", "engine", "other"],
        Field(description="family of the constraint"),
    ]
    subject: Annotated[str | None, Field(description="the offer (availability), replicas (memory, link, engine)")] = None
    derived: Annotated[bool, Field(description="false: reported by the compose pass; true: derived here from the chains")]
    text: Annotated[str, Field(description="the constraint in words")]


class OfferCost(Frozen):
    offer: Annotated[str, Field(description="region/GPUxN")]
    gpu: Annotated[str, Field(description="GPU type")]
    region: Annotated[str, Field(description="region")]
    cloud: Annotated[str | None, Field(description="cloud")]
    owned: Annotated[bool, Field(description="owned nodes cost nothing per hour")]
    nodes: Annotated[int, Field(description="nodes used")]
    gpus: Annotated[int, Field(description="GPUs used")]
    price_per_hour: Annotated[float, Field(description="$/h")]
    share: Annotated[float, Field(description="fraction of the plan's $/h")]
    price_source: Annotated[str | None, Field(description="where the offer's price came from (plan.json prices): "
                                                          "'spec' or 'catalog default (..., checked DATE)'")] = None


class RegionCost(Frozen):
    region: Annotated[str, Field(description="region")]
    nodes: Annotated[int, Field(description="nodes used")]
    gpus: Annotated[int, Field(description="GPUs used")]
    price_per_hour: Annotated[float, Field(description="$/h")]
    share: Annotated[float, Field(description="fraction of the plan's $/h")]


class CostBreakdown(Frozen):
    price_per_hour: Annotated[float, Field(description="the plan's $/h (sum over nodes)")]
    budget_per_hour: Annotated[float | None, Field(description="the spec's budget, $/h (null: none)")]
    budget_left_per_hour: Annotated[float | None, Field(description="budget - price, $/h")]
    owned_gpus: Annotated[int, Field(description="GPUs on owned nodes")]
    rented_gpus: Annotated[int, Field(description="GPUs on rented nodes")]
    idle_nodes: Annotated[tuple[str, ...], Field(description="nodes no replica uses (paid for, serving nothing)")]
    by_offer: Annotated[tuple[OfferCost, ...], Field(description="sorted by offer")]
    by_region: Annotated[tuple[RegionCost, ...], Field(description="sorted by region")]


class PassView(Frozen):
    name: Annotated[str, Field(description="pass name")]
    status: Annotated[str, Field(description="ok, optimal, time-limit, ...")]
    objective: Annotated[float | None, Field(description="objective value the pass reports")]
    bound: Annotated[float | None, Field(description="proven bound on the objective")]
    gap: Annotated[float | None, Field(description="relative gap between objective and bound")]
    notes: Annotated[tuple[str, ...], Field(description="the pass's notes")]


class SolverView(Frozen):
    objective: Annotated[str | None, Field(description="the spec's objective")]
    objective_value: Annotated[float | None, Field(description="the plan's objective value")]
    bound: Annotated[float | None, Field(description="proven bound on the objective (null: none)")]
    gap: Annotated[float | None, Field(description="(bound - value) / value; 0: proven optimal")]
    text: Annotated[str, Field(description="what the bound and gap mean for this plan")]
    passes: Annotated[tuple[PassView, ...], Field(description="every pass, in pipeline order")]


class EstimateGroup(Frozen):
    source: Annotated[str, Field(description="analytic or measured")]
    replicas: Annotated[tuple[str, ...], Field(description="replicas whose estimates come from it")]
    text: Annotated[str, Field(description="where such numbers come from")]


class WorkloadView(Frozen):
    name: Annotated[str, Field(description="workload")]
    model: Annotated[str | None, Field(description="model")]
    demand: Annotated[float | None, Field(description="rate (requests/s), share of the mix, or number of requests")]
    demand_kind: Annotated[str | None, Field(description="rate, share or requests")]
    input_tokens: Annotated[float | None, Field(description="mean prompt tokens")]
    output_tokens: Annotated[float | None, Field(description="mean output tokens")]
    served_requests_per_s: Annotated[float, Field(description="s_w")]
    capacity_requests_per_s: Annotated[float, Field(description="K_w: all replicas at full load, planned mix")]
    replicas: Annotated[tuple[str, ...], Field(description="replicas routed some of it")]
    ttft_s: Annotated[float | None, Field(description="p99 TTFT at the planned load (plan.json's predicted: the tail model, worst routed replica)")]
    tpot_s: Annotated[float | None, Field(description="p99 TPOT at the planned load (as ttft_s)")]


class Summary(Frozen):
    requests_per_s: Annotated[float | None, Field(description="requests/s served (sum over workloads)")]
    tokens_per_s: Annotated[float | None, Field(description="prompt + output tokens/s")]
    output_tokens_per_s: Annotated[float | None, Field(description="output tokens/s")]
    price_per_hour: Annotated[float | None, Field(description="$/h of the plan's nodes")]
    budget_per_hour: Annotated[float | None, Field(description="the spec's budget, $/h (null: none)")]
    gpus: Annotated[int, Field(description="GPUs on the plan's nodes")]
    nodes: Annotated[int, Field(description="nodes")]
    replicas: Annotated[int, Field(description="replicas")]
    makespan_s: Annotated[float | None, Field(description="time to finish a requests-kind workload, s (null: rate workloads)")] = None


class Explanation(Frozen):
    """Why a plan looks the way it does."""

    kind: Annotated[Literal["explanation"], Field(description="output kind")] = "explanation"
    schema_version: Annotated[int, Field(description="bumped when a field changes meaning")] = SCHEMA_VERSION
    plan: Annotated[str, Field(description="plan name")]
    spec_hash: Annotated[str | None, Field(description="sha256 of the spec")]
    models: Annotated[tuple[str, ...], Field(description="models served")]
    summary: Annotated[Summary, Field(description="headline numbers")]
    binding: Annotated[tuple[PlanBinding, ...], Field(description="what stops the plan from growing")]
    workloads: Annotated[tuple[WorkloadView, ...], Field(description="sorted by name")]
    replicas: Annotated[tuple[ReplicaView, ...], Field(description="sorted by id")]
    cost: Annotated[CostBreakdown, Field(description="where the money goes")]
    solver: Annotated[SolverView, Field(description="objective, bound and gap")]
    estimates: Annotated[tuple[EstimateGroup, ...], Field(description="where each estimate came from")]
    placement: Annotated[tuple[ModelPlacement, ...] | None, Field(description="the plan's placement block as plan.json has it (null when absent)")] = None
    primary_workers: Annotated[tuple[PrimaryWorkers, ...] | None, Field(
        description="Hetis primary-worker selection per replica as plan.json has it: GPUs left out, why, what was done with "
                    "them, and what they would add as attention workers (not deployable on vLLM 0.33); absent when none")] = None
    notes: Annotated[tuple[str, ...], Field(description="anything unusual, in words")]
    what_it_would_take: Annotated[tuple[str, ...], Field(
        description="the budget that serves the whole demand and what one more step of each binding constraint buys "
                    "(plan.json what_it_would_take, in words); empty when the plan has none")] = ()
    alternatives: Annotated[tuple[str, ...], Field(
        description="the cost vs served-demand frontier of compose's budget sweep (this plan marked) and the runners-up "
                    "with why each lost (plan.json alternatives, in words); empty when the plan has none")] = ()
    disaggregation: Annotated[tuple[str, ...], Field(
        description="each prefill/decode group as a line (prefill replicas, the KV link, decode replicas) and the plan beside "
                    "the same spec built without groups (plan.json groups and aggregated); empty when the plan has none")] = ()


# --------------------------------------------------------------------------- diff


class PlanRef(Frozen):
    plan: Annotated[str, Field(description="plan name")]
    spec_hash: Annotated[str | None, Field(description="sha256 of the spec")]
    models: Annotated[tuple[str, ...], Field(description="models served")]


class OfferDelta(Frozen):
    offer: Annotated[str, Field(description="region/GPUxN")]
    status: Annotated[Literal["added", "removed", "changed"], Field(description="offer new, gone, or used differently")]
    old_nodes: Annotated[int, Field(description="nodes in the old plan")]
    new_nodes: Annotated[int, Field(description="nodes in the new plan")]
    old_gpus: Annotated[int, Field(description="GPUs in the old plan")]
    new_gpus: Annotated[int, Field(description="GPUs in the new plan")]
    delta_price_per_hour: Annotated[float, Field(description="new $/h - old $/h")]


class NodeRef(Frozen):
    id: Annotated[str, Field(description="node id (a label: place numbers nodes per offer in order)")]
    offer: Annotated[str | None, Field(description="offer")]
    price_per_hour: Annotated[float, Field(description="$/h")]


class ReplicaRef(Frozen):
    id: Annotated[str, Field(description="replica id in its plan")]
    model: Annotated[str, Field(description="model")]
    shape: Annotated[str | None, Field(description="shape")]
    regions: Annotated[tuple[str, ...], Field(description="regions")]
    gpus: Annotated[int, Field(description="GPUs")]
    price_per_hour: Annotated[float, Field(description="$/h")]


class FieldChange(Frozen):
    field: Annotated[str, Field(description="layers, tp, pp, region, gpu, offer, dtype, nodes, estimate, engine (the vLLM flags that differ)")]
    old: Annotated[str, Field(description="old value, as text")]
    new: Annotated[str, Field(description="new value, as text")]


class ReplicaPair(Frozen):
    old: Annotated[str, Field(description="replica id in the old plan")]
    new: Annotated[str, Field(description="replica id in the new plan")]
    relabelled: Annotated[bool, Field(description="same deployment under other node or replica ids")]
    changes: Annotated[tuple[FieldChange, ...], Field(description="what differs (empty when untouched)")]
    in_place: Annotated[bool, Field(description="same nodes' offers, depth and TP: a restart with new engine args would do")]
    delta_price_per_hour: Annotated[float, Field(description="new $/h - old $/h")]


class WeightShift(Frozen):
    workload: Annotated[str, Field(description="workload class")]
    old: Annotated[str | None, Field(description="replica id in the old plan (null: added)")]
    new: Annotated[str | None, Field(description="replica id in the new plan (null: removed)")]
    old_weight: Annotated[float, Field(description="share before")]
    new_weight: Annotated[float, Field(description="share after")]
    delta: Annotated[float, Field(description="new - old")]


class MetricDelta(Frozen):
    metric: Annotated[str, Field(description="totals key")]
    old: Annotated[float | None, Field(description="old value")]
    new: Annotated[float | None, Field(description="new value")]
    delta: Annotated[float | None, Field(description="new - old (null when either is missing)")]


class WorkloadDelta(Frozen):
    workload: Annotated[str, Field(description="workload")]
    old_served: Annotated[float | None, Field(description="s_w in the old plan")]
    new_served: Annotated[float | None, Field(description="s_w in the new plan")]
    old_capacity: Annotated[float | None, Field(description="K_w of the old plan")]
    new_capacity: Annotated[float | None, Field(description="K_w of the new plan")]
    old_ttft_s: Annotated[float | None, Field(description="p99 TTFT at the old plan's planned load, s")]
    new_ttft_s: Annotated[float | None, Field(description="p99 TTFT at the new plan's planned load, s")]
    old_tpot_s: Annotated[float | None, Field(description="p99 TPOT at the old plan's planned load, s")]
    new_tpot_s: Annotated[float | None, Field(description="p99 TPOT at the new plan's planned load, s")]


class Unit(Frozen):
    """A running replica during a migration: old only, new only, or both (untouched)."""

    old: Annotated[str | None, Field(description="replica id in the old plan")] = None
    new: Annotated[str | None, Field(description="replica id in the new plan")] = None

    @model_validator(mode="after")
    def _named(self) -> "Unit":
        if self.old is None and self.new is None:
            raise ValueError("a unit names an old or a new replica")
        return self

    def id_on(self, side: str) -> str:
        """Its replica id in the `side` ('old' or 'new') plan: a unit run or routed on a side has one."""
        rid = self.old if side == "old" else self.new
        if rid is None:
            raise ValueError(f"{self.label} has no replica in the {side} plan")
        return rid

    @property
    def home(self) -> tuple[str, str]:
        """(side, replica id) it runs as: the old replica while there is one, else the new one."""
        return ("old", self.old) if self.old is not None else ("new", self.id_on("new"))

    @property
    def label(self) -> str:
        if self.old is None:
            return f"new {self.new}"
        if self.new is None:
            return f"old {self.old}"
        return self.old if self.old == self.new else f"{self.old} (new {self.new})"


class Routed(Frozen):
    unit: Annotated[Unit, Field(description="replica")]
    mix: Annotated[Literal["old", "new"], Field(description="which plan's mix it serves (k_{r,w} of that plan)")]
    weights: Annotated[dict[str, float], Field(description="its share of each workload class: k_{r,w} / K_w")]


class StepCapacity(Frozen):
    workload: Annotated[str, Field(description="workload")]
    requests_per_s: Annotated[float, Field(description="K_w of the routed replicas after the step")]
    target: Annotated[float, Field(description="min(K_w(old), K_w(new))")]


class Step(Frozen):
    index: Annotated[int, Field(description="1-based order")]
    action: Annotated[
        Literal["launch", "route", "drain", "teardown", "restart"],
        Field(description="launch: bring a replica up and wait until healthy; route: write the routing table; "
                          "drain: take a replica out of the table and wait for its in-flight requests; "
                          "teardown: stop it; restart: stop vLLM on a drained replica's cluster and start it with "
                          "the new plan's engine args (same machines: no provisioning), wait until healthy"),
    ]
    unit: Annotated[Unit | None, Field(description="the replica (null for route; for restart, the new side)")] = None
    replaces: Annotated[Unit | None, Field(description="restart: the old side, whose cluster the new side runs on")] = None
    routed: Annotated[tuple[Routed, ...], Field(description="the routing table after a route step (empty otherwise)")] = ()
    text: Annotated[str, Field(description="the step in words")]
    price_per_hour: Annotated[float, Field(description="$/h of what runs after the step")]
    capacity: Annotated[tuple[StepCapacity, ...], Field(description="serving capacity after the step")]


class Dip(Frozen):
    step: Annotated[int, Field(description="step index")]
    workload: Annotated[str, Field(description="workload")]
    requests_per_s: Annotated[float, Field(description="capacity after the step")]
    target: Annotated[float, Field(description="min(K_w(old), K_w(new))")]


class Migration(Frozen):
    mode: Annotated[
        Literal["none", "in-place", "side-by-side", "rolling"],
        Field(description="none: nothing to do; in-place: only engine args change, each such replica restarts on "
                          "its own cluster; side-by-side: new replicas up before old ones go; rolling: "
                          "old replicas go before new ones come, because old + new together exceed a ceiling "
                          "(both may start with in-place restarts)"),
    ]
    ceiling_per_hour: Annotated[float | None, Field(description="max $/h while migrating: max(new budget, old $/h)")]
    peak_price_per_hour: Annotated[float, Field(description="highest $/h over the steps")]
    checks: Annotated[tuple[str, ...], Field(description="budget / availability checks, in words")]
    untouched: Annotated[tuple[Unit, ...], Field(description="replicas that keep running as they are")]
    steps: Annotated[tuple[Step, ...], Field(description="ordered steps")]
    capacity_kept: Annotated[bool, Field(description="capacity never below min(old, new) per workload")]
    dips: Annotated[tuple[Dip, ...], Field(description="where capacity drops below the target, and by how much")]


class PlanDiff(Frozen):
    """What changes between two plans, and how to get from one to the other."""

    kind: Annotated[Literal["diff"], Field(description="output kind")] = "diff"
    schema_version: Annotated[int, Field(description="bumped when a field changes meaning")] = SCHEMA_VERSION
    old: Annotated[PlanRef, Field(description="the plan running now")]
    new: Annotated[PlanRef, Field(description="the plan to roll out")]
    empty: Annotated[bool, Field(description="nothing differs that a deployment would notice")]
    notes: Annotated[tuple[str, ...], Field(description="caveats (different models, spec, ...)")]
    offers: Annotated[tuple[OfferDelta, ...], Field(description="offers whose use changes")]
    nodes_added: Annotated[tuple[NodeRef, ...], Field(description="node ids only in the new plan")]
    nodes_removed: Annotated[tuple[NodeRef, ...], Field(description="node ids only in the old plan")]
    untouched: Annotated[tuple[ReplicaPair, ...], Field(description="same deployment in both plans")]
    changed: Annotated[tuple[ReplicaPair, ...], Field(description="same model and GPU type, something else differs")]
    added: Annotated[tuple[ReplicaRef, ...], Field(description="replicas only in the new plan")]
    removed: Annotated[tuple[ReplicaRef, ...], Field(description="replicas only in the old plan")]
    routing: Annotated[tuple[WeightShift, ...], Field(description="routing weights that move")]
    totals: Annotated[tuple[MetricDelta, ...], Field(description="throughput, cost, GPU and solver deltas that are not 0")]
    workloads: Annotated[tuple[WorkloadDelta, ...], Field(description="per workload rate, capacity and latency, where they move")]
    binding_added: Annotated[tuple[str, ...], Field(description="constraints that bind only in the new plan")]
    binding_removed: Annotated[tuple[str, ...], Field(description="constraints that bound only the old plan")]
    migration: Annotated[Migration, Field(description="how to roll the new plan out")]


ExplainOutput = Annotated[Union[Explanation, PlanDiff], Field(discriminator="kind")]
ADAPTER: TypeAdapter = TypeAdapter(ExplainOutput)


def json_schema() -> dict:
    """The schema of `explain --format json` (both kinds)."""
    schema = ADAPTER.json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "hetcompile explain output"
    return schema
